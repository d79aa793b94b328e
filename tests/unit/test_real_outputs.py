"""The outputs run on real SGLang 0.5.17 (H200, tiny Qwen3-Next, xgrammar), checked from its
data (bench/real_sglang/data/2026-12-01-h200-s5/outputs): 400 prompts with integer ids and a
`topic` column, n = 2, stop "\\n\\n" for the job, a JSON schema on every other row.

Ids, columns and samples came through (800 rows, each (id, sample) once, Int64 ids, topics as
given, the two samples of every prompt different). The job's stop string, sent with the
constrained rows too, ended 338 of their 400 outputs mid-object (xgrammar lets JSON carry
whitespace, random weights emit plenty): the request builder of tasks/requests.py is held to
those rows — what it sends for them today carries no stop string, and what it sends for the
unconstrained ones still carries the job's."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from infra.prompt_row import PromptRow
from tasks.requests import DispatchOptions, build_request

DATA = (Path(__file__).resolve().parents[2] / "bench" / "real_sglang" / "data"
        / "2026-12-01-h200-s5" / "outputs")


def parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def test_ids_columns_and_samples_came_through_real_sglang() -> None:
    rows = pl.read_parquet(DATA / "rows.parquet")
    assert rows.height == 800 and rows.schema["id"] == pl.Int64
    assert rows.select("id", "sample_index").n_unique() == 800
    assert set(rows["sglang_version"]) == {"0.5.17"}
    expected_topic = (rows["id"] - 5000) % 4
    assert (rows["topic"] == ("t" + expected_topic.cast(pl.String))).all()
    differ = rows.group_by("id").agg(pl.col("completion").n_unique())["completion"]
    assert (differ == 2).all()
    seeds = rows.sort("id", "sample_index").group_by("id", maintain_order=True).agg(
        pl.col("sampling_params").map_elements(
            lambda s: json.loads(s)["sampling_seed"], return_dtype=pl.Int64))
    assert all(list(v) == [0, 1] for v in seeds["sampling_params"])


def _sent_params(row: dict[str, object], sample: int) -> dict[str, object]:
    """The sampling parameters today's builder sends for a recorded row, with the run's job
    sampling (its stop string among them)."""
    job = json.loads(row["sampling_params"])  # type: ignore[arg-type]
    opts = DispatchOptions("tiny", None, {"max_new_tokens": job["max_new_tokens"],
                                          "temperature": job["temperature"],
                                          "top_p": job["top_p"], "stop": ["\n\n"],
                                          "seed": 0}, 60.0, 1, 0.0, samples=2)
    source = PromptRow.from_columns({"id": row["id"], "prompt": "p",
                                     "json_schema": row["json_schema"]})
    _, body = build_request(source, opts, sample)
    params: dict[str, object] = body["sampling_params"]
    return params


def test_the_rows_the_stop_string_cut_are_now_sent_without_it() -> None:
    rows = pl.read_parquet(DATA / "rows.parquet")
    constrained = rows.filter(pl.col("json_schema").is_not_null())
    ok = constrained["completion"].map_elements(parses, return_dtype=pl.Boolean)
    cut = constrained.filter(~ok)
    # what the run sent them: the job's stop, and each was ended by it mid-object
    assert constrained.height == 400 and cut.height == 338
    assert set(cut["finish_reason"]) == {"stop"}
    assert all(json.loads(s)["stop"] == ["\n\n"] for s in cut["sampling_params"])
    for row in cut.iter_rows(named=True):
        sent = _sent_params(row, row["sample_index"])
        assert "stop" not in sent and sent["json_schema"] == row["json_schema"]
        assert sent["sampling_seed"] == json.loads(row["sampling_params"])["sampling_seed"]
    free = rows.filter(pl.col("json_schema").is_null()).row(0, named=True)
    assert _sent_params(free, 0)["stop"] == ["\n\n"]
