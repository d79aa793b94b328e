"""Check an outputs run (job_tiny_outputs.toml) against its input: every (id, sample) once,
ids and the extra column as given, schema rows valid JSON for the schema. Prints one JSON line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import polars as pl

SCHEMA = {"type": "object", "properties": {"label": {"enum": ["good", "bad"]},
                                           "score": {"type": "integer"}},
          "required": ["label", "score"], "additionalProperties": False}


def make_input(path: Path, n: int) -> None:
    pl.DataFrame({"id": list(range(5000, 5000 + n)),
                  "prompt": [f"Rate item {i} and explain." for i in range(n)],
                  "topic": [f"t{i % 4}" for i in range(n)],
                  "json_schema": [json.dumps(SCHEMA) if i % 2 else None for i in range(n)],
                  }).write_ndjson(path)


def check(inp: Path, out: Path) -> dict:
    given = pl.read_ndjson(inp)
    rows = pl.concat([pl.read_parquet(p) for p in sorted((out / "shards").glob("*.parquet"))],
                     how="diagonal_relaxed")
    joined = given.select("id", "topic").join(rows.select("id", "topic", "sample_index"),
                                              on="id", suffix="_out")
    valid = invalid = 0
    for row in rows.filter(pl.col("json_schema").is_not_null()).iter_rows(named=True):
        try:
            jsonschema.validate(json.loads(row["completion"]), SCHEMA)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            invalid += 1
    plain = rows.filter(pl.col("json_schema").is_null())
    return {"rows": rows.height, "unique_id_sample": rows.select("id", "sample_index").n_unique(),
            "id_dtype": str(rows.schema["id"]), "joined": joined.height,
            "topic_kept": bool((joined["topic"] == joined["topic_out"]).all()),
            "schema_valid": valid, "schema_invalid": invalid,
            "plain_with_stop_string": int(plain["completion"].str.contains("\n\n").sum()),
            "finish_reasons": rows["finish_reason"].value_counts().rows(),
            "sglang_version": rows["sglang_version"].unique().to_list(),
            "samples_differ": int((rows.group_by("id").agg(pl.col("completion").n_unique())
                                   ["completion"] > 1).sum())}


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make_input(Path(sys.argv[2]), int(sys.argv[3]))
    else:
        print(json.dumps(check(Path(sys.argv[2]), Path(sys.argv[3]))))
