"""The outputs run on real SGLang 0.5.17 (H200, tiny Qwen3-Next, xgrammar), checked from its
data (bench/real_sglang/data/2026-12-01-h200-s5/outputs): 400 prompts with integer ids and a
`topic` column, n = 2, stop "\\n\\n" for the job, a JSON schema on every other row.

What it showed: ids, columns and samples came through (800 rows, each (id, sample) once,
Int64 ids, topics as given, the two samples of every prompt different); and the job's stop
string, applied to the constrained rows too, ended 338 of their 400 outputs mid-object —
xgrammar lets JSON carry whitespace, and random weights emit plenty. Since then the job's
stop strings are not sent with constrained rows (tasks/requests.py)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

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


def test_the_stop_string_cut_constrained_rows_short() -> None:
    rows = pl.read_parquet(DATA / "rows.parquet").filter(pl.col("json_schema").is_not_null())
    ok = rows["completion"].map_elements(parses, return_dtype=pl.Boolean)
    assert rows.height == 400 and int(ok.sum()) == 62
    cut = rows.filter(~ok)
    assert set(cut["finish_reason"]) == {"stop"}  # ended by the stop string, not by length
    assert all(json.loads(s)["stop"] == ["\n\n"] for s in cut["sampling_params"])
    assert all(c.lstrip().startswith("{") for c in cut["completion"])  # JSON, cut mid-way
