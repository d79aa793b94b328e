"""Bad input is refused before any GPU time, naming the row or column."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from infra.prompts import InputError, iter_rows, validate_input


def jsonl(tmp_path: Path, rows: list[dict], name: str = "p.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_valid_jsonl_is_summarized(tmp_path: Path) -> None:
    path = jsonl(tmp_path, [{"id": i, "prompt": f"p{i}"} for i in range(5)])
    s = validate_input(path)
    assert s.rows == 5 and s.kind == "prompt" and s.format == "jsonl"
    assert [r["id"] for r in iter_rows(path, 1, 3)] == ["1", "2"]


def test_integer_ids_and_the_users_columns_come_through_as_given(tmp_path: Path) -> None:
    rows = [{"id": 10 + i, "prompt": f"p{i}", "topic": "t", "meta": {"k": i}} for i in range(4)]
    path = jsonl(tmp_path, rows)
    s = validate_input(path)
    assert s.id_dtype == "Int64"
    got = list(iter_rows(path, 0, 4, batch=2, id_dtype=s.id_dtype))
    assert [r["id"] for r in got] == [10, 11, 12, 13]
    assert got[3]["topic"] == "t" and got[3]["meta"] == {"k": 3}


def test_parquet_with_messages(tmp_path: Path) -> None:
    path = tmp_path / "p.parquet"
    pl.DataFrame({"id": ["a", "b"], "messages": [[{"role": "user", "content": "x"}],
                                                 [{"role": "user", "content": "y"}]]}
                 ).write_parquet(path)
    assert validate_input(path).kind == "messages"


def batch(custom_id: str, url: str = "/v1/chat/completions", **body: object) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url,
            "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}}


def completion(custom_id: str, prompt: object, **body: object) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
            "body": {"model": "m", "prompt": prompt, **body}}


OBJECT_SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}}
ARRAY_SCHEMA = {"type": "array", "items": {"type": "string"}, "minItems": 2}


def test_openai_batch_response_format_reaches_sglang_as_each_row_gave_it(tmp_path: Path) -> None:
    """polars reads nested objects as one struct for the file: row 0's schema came back with
    row 1's `items` and `minItems` as nulls. The rows sent keep each schema as written."""
    path = jsonl(tmp_path, [
        batch("r0", response_format={"type": "json_schema",
                                     "json_schema": {"name": "o", "schema": OBJECT_SCHEMA}}),
        batch("r1", response_format={"type": "json_schema",
                                     "json_schema": {"name": "a", "schema": ARRAY_SCHEMA,
                                                     "strict": True}}),
        batch("r2", response_format={"type": "json_object"}),
        batch("r3", response_format={"type": "text"}),
        batch("r4")])
    assert validate_input(path).kind == "messages"
    schemas = [r["json_schema"] for r in iter_rows(path, 0, 5)]
    assert [json.loads(str(x)) if x else x for x in schemas] == [
        OBJECT_SCHEMA, ARRAY_SCHEMA, {"type": "object"}, None, None]


def test_own_jsonl_json_schema_objects_are_kept_per_row(tmp_path: Path) -> None:
    path = jsonl(tmp_path, [{"id": 1, "prompt": "a", "json_schema": OBJECT_SCHEMA},
                            {"id": 2, "prompt": "b", "json_schema": ARRAY_SCHEMA}])
    validate_input(path)
    assert [json.loads(str(r["json_schema"])) for r in iter_rows(path, 0, 2)] == [OBJECT_SCHEMA,
                                                                            ARRAY_SCHEMA]


def test_openai_batch_completions_rows_are_text_or_token_ids(tmp_path: Path) -> None:
    path = jsonl(tmp_path, [completion("c0", "Once upon", max_tokens=9, stop="\n"),
                            completion("c1", "a time", temperature=0.5)])
    summary = validate_input(path)
    assert (summary.format, summary.kind) == ("openai_batch", "prompt")
    rows = list(iter_rows(path, 0, 2))
    assert rows[0] == {"id": "c0", "prompt": "Once upon", "max_new_tokens": 9,
                       "temperature": None, "stop": "\n"}
    ids = jsonl(tmp_path, [completion("t0", [1, 2, 3])], "ids.jsonl")
    assert validate_input(ids).kind == "input_ids"
    assert next(iter_rows(ids, 0, 1))["input_ids"] == [1, 2, 3]


def test_openai_batch_stop_and_n_of_one_are_read(tmp_path: Path) -> None:
    path = jsonl(tmp_path, [batch("r0", stop=["\n\n", "END"], n=1, max_completion_tokens=7)])
    validate_input(path)
    first = next(iter_rows(path, 0, 1))
    assert first["stop"] == ["\n\n", "END"] and first["max_new_tokens"] == 7


def test_openai_batch_jsonl(tmp_path: Path) -> None:
    rows = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 10}} for i in range(3)]
    path = jsonl(tmp_path, rows)
    s = validate_input(path)
    assert s.format == "openai_batch" and s.rows == 3
    first = next(iter_rows(path, 0, 1))
    assert first["id"] == "r0" and first["max_new_tokens"] == 10


@pytest.mark.parametrize(("rows", "needle"), [
    ([{"id": 1, "prompt": "a"}, {"id": 1, "prompt": "b"}], "row 1: duplicate id 1"),
    # 1 and "1" would be one row once written: the column is read as strings, and they clash
    ([{"id": 1, "prompt": "a"}, {"id": "1", "prompt": "b"}], "row 1: duplicate id '1'"),
    ([{"id": 1, "prompt": "a"}, {"id": 2, "prompt": "  "}], "row 1 (id 2): empty prompt"),
    ([{"id": 1.5, "prompt": "a"}], "`id` is Float64; ids must be integers or strings"),
    ([{"id": 1, "prompt": "a", "completion": "x"}], "column `completion` is a name the output "
                                                    "uses; rename it"),
    ([{"prompt": "a"}], "no `id` column"),
    ([{"id": 1, "text": "a"}], "needs a `prompt`, `messages` or `input_ids` column"),
    ([{"id": 1, "prompt": "a"}, {"id": None, "prompt": "b"}], "row 1: `id` is missing"),
    # one kind of text per file: a row with both was read as its prompt, silently
    ([{"id": 1, "prompt": "a", "messages": [{"role": "user", "content": "b"}]}],
     "has both `prompt` and `messages`"),
    ([{"id": 1, "prompt": "a"}, {"id": 2, "messages": [{"role": "user", "content": "b"}]}],
     "has both `prompt` and `messages`"),
    ([{"id": 1, "prompt": 123}], "`prompt` is Int64, not text"),
    # a row's own max_new_tokens: -3 was accepted (and counted as -3 tokens)
    ([{"id": 1, "prompt": "a", "max_new_tokens": 8}, {"id": 2, "prompt": "b",
                                                       "max_new_tokens": -3}],
     "row 1 (id 2): `max_new_tokens` is -3; it must be at least 1"),
    ([{"id": 1, "prompt": "a", "max_new_tokens": "lots"}],
     "`max_new_tokens` must be a whole number of tokens"),
    ([{"custom_id": "r1", "body": {"messages": [{"role": "user", "content": "a"}],
                                    "max_tokens": 0}}],
     "(id 'r1'): `body.max_tokens` is 0; it must be at least 1"),
    # OpenAI batch fields this pipeline would not honour are named, not dropped
    ([batch("r1", url="/v1/embeddings")], "`url` /v1/embeddings: only /v1/chat/completions"),
    ([batch("r1", n=1), batch("r2", n=2)], "body.n is 2"),
    ([batch("r1", response_format={"type": "structural_tag", "structures": []})],
     "body.response_format type 'structural_tag' is not supported here"),
    ([batch("r1", response_format={"type": "json_schema", "json_schema": {"name": "x"}})],
     "(id 'r1'): body.response_format of type json_schema needs json_schema.schema"),
    ([batch("r1", response_format={"type": "text"}), batch("r2", response_format={"x": 1})],
     "(id 'r2'): body.response_format has no `type`"),
    ([batch("r1", logprobs=True)], "body.logprobs is not supported here; this pipeline does "
                                   "not collect log-probabilities"),
    ([batch("r1"), completion("r2", "hello")],
     "rows for both /v1/chat/completions and /v1/completions; one kind of text per file"),
    ([completion("r1", ["a", "b"])], "body.prompt is List(String); give each row one prompt"),
    ([completion("r1", "a", echo=True)], "body.echo is not supported here"),
])
def test_bad_rows_are_named(tmp_path: Path, rows: list[dict], needle: str) -> None:
    with pytest.raises(InputError) as info:
        validate_input(jsonl(tmp_path, rows))
    assert needle in str(info.value)


def test_non_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"id": 1, "prompt": "ok"}\n{"id": 2, "prompt": "\xff"}\n')
    with pytest.raises(InputError, match="line 2: not UTF-8"):
        validate_input(path)


def test_malformed_json_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": 1, "prompt": "ok"}\n\n{"id": 2, "prompt": \n')
    with pytest.raises(InputError, match="line 3: Expecting value at column 21"):
        validate_input(path)
    with pytest.raises(InputError, match="does not exist"):
        validate_input(tmp_path / "missing.jsonl")
    with pytest.raises(InputError, match="must end in"):
        validate_input(jsonl(tmp_path, [{"id": 1, "prompt": "a"}], "p.csv"))


@pytest.mark.parametrize(("start", "stop"), [(0, 10), (3, 17), (250, 260), (990, 1000),
                                             (0, 1000)])
def test_parquet_streaming_matches_the_input_slice(tmp_path: Path, start: int,
                                                  stop: int) -> None:
    path = tmp_path / "p.parquet"
    pl.DataFrame({"id": [f"r{i}" for i in range(1000)],
                  "prompt": [f"q{i}" for i in range(1000)]}).write_parquet(
        path, row_group_size=128)
    got = [r["id"] for r in iter_rows(path, start, stop, batch=50)]
    assert got == [f"r{i}" for i in range(start, stop)]


def test_jsonl_streaming_skips_blank_lines_like_the_scan(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": 0, "prompt": "a"}\n\n{"id": 1, "prompt": "b"}\n'
                    '{"id": 2, "prompt": "c"}\n')
    assert validate_input(path).rows == 3
    assert [r["id"] for r in iter_rows(path, 1, 3, batch=1)] == ["1", "2"]
