"""The output keeps the user's data and says how each row was made: integer ids and extra
columns as given, n samples per prompt, stop strings and a JSON schema per row honoured,
provenance per row — and the shards join back to the input without a cast, and read as a
dataset with pyarrow and Hugging Face `datasets`."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import polars as pl
import pytest

from infra.export import export_jsonl, export_openai_batch
from infra.manifest import Manifest
from tests.conftest import free_port_block

SCHEMA = {"type": "object", "properties": {"title": {"type": "string"},
                                           "score": {"type": "integer"},
                                           "tags": {"type": "array",
                                                    "items": {"type": "string"}}},
          "required": ["title", "score"]}


def write_input(path: Path, n: int) -> pl.DataFrame:
    frame = pl.DataFrame({
        "id": list(range(1000, 1000 + n)),
        "prompt": [f"Describe item {i}" for i in range(n)],
        "topic": [f"topic-{i % 3}" for i in range(n)],
        "difficulty": [i % 5 for i in range(n)],
        "json_schema": [json.dumps(SCHEMA) if i % 2 else None for i in range(n)],
    })
    frame.write_ndjson(path)
    return frame


@pytest.mark.slow
def test_ids_columns_samples_stops_and_schemas(prefect_api: None, tmp_path: Path) -> None:
    from flows.generate import generate

    given = write_input(tmp_path / "in.jsonl", 120)
    out = tmp_path / "out"
    summary = generate(prompts=str(tmp_path / "in.jsonl"), output=str(out), gpus=[0, 1],
                       overrides={"base_port": free_port_block(2), "sim.startup_s": 0.3,
                                  "shard_size": 25, "sampling.n": 2,
                                  "sampling.stop": ["because"], "sampling.max_new_tokens": 64,
                                  "tuning.enabled": False})
    assert summary["errors_this_run"] == 0
    rows = Manifest(out).read_completions()
    assert rows.schema["id"] == pl.Int64 and rows.height == 240
    # Every (id, sample) once; joins back on the id as given, no cast.
    assert rows.select("id", "sample_index").n_unique() == 240
    assert set(rows["sample_index"].unique()) == {0, 1}
    joined = given.select("id", "topic", "difficulty").join(
        rows.select("id", "sample_index", "topic", "difficulty"), on="id", suffix="_out")
    assert joined.height == 240
    assert (joined["topic"] == joined["topic_out"]).all()
    assert (joined["difficulty"] == joined["difficulty_out"]).all()
    # Constrained rows validate; the others never contain the stop string.
    for row in rows.iter_rows(named=True):
        if row["json_schema"] is not None:
            jsonschema.validate(json.loads(row["completion"]), SCHEMA)
        else:
            assert "because" not in row["completion"]
    stopped = rows.filter(pl.col("json_schema").is_null() & (pl.col("finish_reason") == "stop"))
    assert stopped.height > 0
    # The two samples of a prompt differ (seed + k) and say how they were made.
    first = rows.filter(pl.col("id") == 1000).sort("sample_index")
    assert first["completion"][0] != first["completion"][1]
    sent = [json.loads(s) for s in first["sampling_params"]]
    assert [p["sampling_seed"] for p in sent] == [0, 1] and sent[0]["stop"] == ["because"]
    assert set(rows["model"]) == {"Qwen/Qwen3.6-27B"} and rows["sglang_version"].null_count() == 0
    assert rows["config"].null_count() == 0 and "cached_tokens" in rows.columns
    # Exports: OpenAI batch lines carry both samples as choices; JSONL keeps every column.
    lines = export_openai_batch(out, tmp_path / "batch.jsonl", "m")
    assert lines == 120
    one = json.loads((tmp_path / "batch.jsonl").read_text().splitlines()[0])
    assert one["custom_id"] == "1000"
    assert [c["index"] for c in one["response"]["body"]["choices"]] == [0, 1]
    assert export_jsonl(out, tmp_path / "rows.jsonl") == 240
    back = pl.read_ndjson(tmp_path / "rows.jsonl")
    assert back.schema["id"] == pl.Int64 and "topic" in back.columns
    check_readers(out, tmp_path)


def check_readers(out: Path, tmp_path: Path) -> None:
    """The shards read as a dataset with the libraries people train with."""
    import os

    import pyarrow.dataset as ds

    table = ds.dataset(out / "shards", format="parquet").to_table()
    assert table.num_rows == 240 and str(table.schema.field("id").type) == "int64"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from datasets import load_dataset

    files = sorted(str(p) for p in (out / "shards").glob("*.parquet"))
    data = load_dataset("parquet", data_files=files, split="train",
                        cache_dir=str(tmp_path / "hf-cache"))
    assert data.num_rows == 240 and data.features["id"].dtype == "int64"
    assert set(data.unique("sample_index")) == {0, 1}
    assert {"topic", "completion", "sampling_params", "model"} <= set(data.column_names)
