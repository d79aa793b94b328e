"""A row becomes the SGLang request it asks for — sampling, stop strings, constraints, sample
k of n — and an answer becomes an output row with the user's columns and its provenance."""

from __future__ import annotations

import json
from typing import Any

from infra.output_row import Answer
from infra.prompt_row import PromptRow
from tasks.requests import Delivery, DispatchOptions, build_request, output_row, sampling_for

OPTS = DispatchOptions("m", None, {"max_new_tokens": 32, "temperature": 0.0, "top_p": 1.0,
                                   "seed": 7, "ignore_eos": False, "stop": ["END"]},
                       30.0, 3, 0.01, samples=2)


def cols(**given: Any) -> PromptRow:
    """A row as the reader gives it: every column, the user's own included."""
    return PromptRow.from_columns(given)


def test_native_request_carries_stop_schema_regex_and_the_samples_seed() -> None:
    row = cols(id=5, prompt="p", json_schema={"type": "object"}, regex=None, stop="###",
               topic="x")
    path, body = build_request(row, OPTS, sample=1)
    assert path == "/generate" and body["text"] == "p"
    params = body["sampling_params"]
    assert params["temperature"] == 0.0  # a greedy job stays greedy
    assert params["stop"] == ["###"]  # the row's stop replaces the job's
    assert json.loads(params["json_schema"]) == {"type": "object"}  # SGLang wants the text
    assert params["sampling_seed"] == 8 and "regex" not in params and "ignore_eos" not in params


def test_chat_request_uses_response_format_for_a_schema() -> None:
    row = cols(id="a", messages=[{"role": "user", "content": "x"}],
               json_schema=json.dumps({"type": "object"}), regex="[a-z]+")
    path, body = build_request(row, OPTS)
    assert path == "/v1/chat/completions"
    assert body["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert body["regex"] == "[a-z]+" and "stop" not in body and body["seed"] == 7


def test_per_row_sampling_overrides_and_no_seed_stays_none() -> None:
    opts = DispatchOptions("m", None, {"max_new_tokens": 8, "temperature": 0.7, "top_p": 0.9,
                                       "seed": None}, 30.0, 3, 0.01, samples=3)
    assert "seed" not in sampling_for(cols(id=1, prompt="p"), opts, 2)
    assert sampling_for(cols(id=1, prompt="p", max_new_tokens=3), opts, 0)["max_new_tokens"] == 3


def test_output_row_keeps_or_drops_the_users_columns() -> None:
    row = cols(id=5, prompt="p", topic="x")
    answer = Answer(completion="c", finish_reason="stop", prompt_tokens=1,
                    completion_tokens=1, cached_tokens=0)
    _, body = build_request(row, OPTS)
    kept = output_row(row, OPTS, answer, Delivery(1, body, "server-0", "cfg", "0.5.17", 0.5))
    assert kept["topic"] == "x" and kept["id"] == 5 and kept["sample_index"] == 1
    assert kept["model"] == "m" and kept["sglang_version"] == "0.5.17"
    assert json.loads(kept["sampling_params"])["stop"] == ["END"]
    lean = output_row(row, DispatchOptions("m", None, {}, 30.0, 3, 0.01,
                                           keep_input_columns=False),
                      answer, Delivery(0, body, "server-0", "cfg", None, 0.5))
    assert "topic" not in lean and "prompt" not in lean and lean["id"] == 5


def test_the_jobs_stop_strings_leave_constrained_rows_alone() -> None:
    """Real SGLang + xgrammar: the job's "\\n\\n" cut 338 of 400 JSON outputs mid-object."""
    constrained = sampling_for(cols(id=1, prompt="p", json_schema="{}"), OPTS, 0)
    assert "stop" not in constrained
    own = sampling_for(cols(id=1, prompt="p", regex="a+", stop=["!"]), OPTS, 0)
    assert own["stop"] == ["!"]  # a row's own stop still applies


def test_the_output_columns_doc_is_made_from_the_row_definition() -> None:
    """docs/OUTPUT.md is `python -m infra.output_row`: the doc cannot drift from the row."""
    from pathlib import Path

    from infra.output_row import markdown

    doc = Path(__file__).resolve().parents[2] / "docs" / "OUTPUT.md"
    assert doc.read_text() == markdown(), "run: python -m infra.output_row > docs/OUTPUT.md"


def test_a_shard_gets_the_declared_types_and_refuses_a_row_without_its_columns() -> None:
    """An all-null sglang_version stays a string column (Parquet inferred Null before); a
    row missing a column every row has is a bug, refused at the write."""
    import io

    import polars as pl
    import pytest

    from infra.output_row import GENERATED, parquet_bytes

    row = {"id": "a", "topic": 3, **output_row(
        PromptRow.from_columns({"id": "a", "prompt": "p"}), OPTS,
        Answer(completion=None, finish_reason="length", prompt_tokens=2, completion_tokens=4,
               cached_tokens=0), Delivery(0, {"text": "p"}, "server-0", "cfg", None, 0.1)),
           "output_ids": [1, 2, 3, 4]}
    frame = pl.read_parquet(io.BytesIO(parquet_bytes([row], GENERATED)))
    assert frame.schema["sglang_version"] == pl.String
    assert frame.schema["completion"] == pl.String
    assert frame.schema["output_ids"] == pl.List(pl.Int64)
    assert frame.schema["topic"] == pl.Int64  # the user's column as the input gave it
    del row["finish_reason"]
    with pytest.raises(ValueError, match="finish_reason"):
        parquet_bytes([row], GENERATED)
