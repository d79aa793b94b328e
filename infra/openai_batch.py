"""OpenAI batch-API input rows (`custom_id`, `method`, `url`, `body`) read as the pipeline's
own columns, or refused: a field this pipeline would not honour is an error naming it, never
dropped in silence (a `body.n` of 2 gave one answer per row, a `body.stop` was not applied,
`"url": "/v1/embeddings"` ran as chat).

Honoured, for `/v1/chat/completions` (`body.messages`) and `/v1/completions` (`body.prompt`:
a string, or a list of token ids): `max_tokens` (or `max_completion_tokens`), `temperature`,
`top_p`, `seed`, `stop`, `n` of 1, and `response_format` as SGLang's OpenAI server applies it
(`json_schema` → its schema, `json_object` → `{"type": "object"}`, `text` → none). `model`
names the deployment in OpenAI's API and is not per row here (the job's model answers every
row). One url per file: its rows are one kind of text.

`response_format` must reach SGLang as the row gave it. polars reads nested objects as one
struct type for the whole file, giving every row the fields of all the others as nulls (row
1's object schema gained `"items": null, "minItems": null` from row 2's array schema): so the
rows that are sent are read with `raw_object_columns` first, which keeps such values as JSON
text. The whole-file scan only validates them (their `type`), never sends them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
TEXT_FIELD = {CHAT_URL: "messages", COMPLETIONS_URL: "prompt"}
SAMPLING = {"max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens",
            "temperature": "temperature", "top_p": "top_p", "seed": "seed", "stop": "stop"}
IGNORED_ON_PURPOSE = {"model", "n", "response_format"}  # (the last is read on its own)
RESPONSE_TYPES = ("json_schema", "json_object", "text")
ADVICE = {
    "stream": "batch answers are not streamed; remove it",
    "logprobs": "this pipeline does not collect log-probabilities; remove it",
    "top_logprobs": "this pipeline does not collect log-probabilities; remove it",
}
# JSON values kept as text in the rows that are sent (see the module's docstring)
RAW_OBJECTS = ("json_schema",)
RAW_BODY_OBJECTS = ("response_format",)


class BatchInputError(ValueError):
    """Raised with the message infra.prompts turns into its InputError."""


def raw_object_columns(line: bytes) -> bytes:
    """One JSONL line with `json_schema` and `body.response_format` as JSON text, so that
    polars reads them per row instead of unifying their fields across rows. Lines without
    them are returned untouched (no parse)."""
    if b'"json_schema"' not in line and b'"response_format"' not in line:
        return line
    row = json.loads(line)
    if not isinstance(row, dict):
        return line
    _stringify(row, RAW_OBJECTS)
    if isinstance(row.get("body"), dict):
        _stringify(row["body"], RAW_BODY_OBJECTS)
    return json.dumps(row).encode() + b"\n"


def _stringify(obj: dict[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:
        if obj.get(key) is not None and not isinstance(obj[key], str):
            obj[key] = json.dumps(obj[key])


def batch_kind(lf: pl.LazyFrame, path: Path) -> str:
    """`messages` (chat rows), `prompt` (completions, text) or `input_ids` (completions,
    token ids); one url per file."""
    schema = lf.collect_schema()
    urls = [CHAT_URL]
    if "url" in schema.names():
        urls = sorted(str(u) for u in lf.select(pl.col("url").unique()).collect()["url"])
    other = [u for u in urls if u not in TEXT_FIELD]
    if other:
        raise BatchInputError(f"prompts: {path}: `url` {other[0]}: only {CHAT_URL} and "
                              f"{COMPLETIONS_URL} rows are generated here; remove the others "
                              "or split the file")
    if len(urls) > 1:
        raise BatchInputError(f"prompts: {path}: rows for both {urls[0]} and {urls[1]}; one "
                              "kind of text per file: split the file")
    fields = _body_fields(schema)
    text = TEXT_FIELD[urls[0]]
    if text not in fields:
        raise BatchInputError(f"prompts: {path}: {urls[0]} rows need body.{text}")
    if text == "messages":
        return "messages"
    dtype = fields["prompt"]
    if dtype == pl.String:
        return "prompt"
    if isinstance(dtype, pl.List) and dtype.inner is not None and dtype.inner.is_integer():
        return "input_ids"
    raise BatchInputError(f"prompts: {path}: body.prompt is {dtype}; give each row one prompt, "
                          "as text or as a list of token ids (a list of prompts is one row each)")


def _body_fields(schema: pl.Schema) -> dict[str, pl.DataType]:
    return {f.name: f.dtype for f in getattr(schema["body"], "fields", [])}


def batch_columns(lf: pl.LazyFrame, path: Path) -> tuple[list[pl.Expr], str]:
    """The select that maps batch rows onto id, the text column and the sampling columns,
    and which text column that is."""
    kind = batch_kind(lf, path)
    fields = _body_fields(lf.collect_schema())
    unknown = sorted(set(fields) - set(SAMPLING) - IGNORED_ON_PURPOSE - {"messages", "prompt"})
    if unknown:
        name = unknown[0]
        fix = ADVICE.get(name, "remove it (it would be ignored)")
        raise BatchInputError(f"prompts: {path}: body.{name} is not supported here; {fix}")
    body = pl.col("body")
    if "n" in fields:
        most = lf.select(body.struct.field("n").max()).collect().item()
        if most is not None and int(most) > 1:
            raise BatchInputError(f"prompts: {path}: body.n is {most}: a job asks every row "
                                  "for the same number of answers; drop body.n and set "
                                  f"`sampling.n` ({'--set sampling.n=' + str(most)})")
    source = "messages" if kind == "messages" else "prompt"
    exprs = [pl.col("custom_id").cast(pl.String).alias("id"),
             body.struct.field(source).alias(kind)]
    taken: set[str] = set()
    for name, column in SAMPLING.items():
        if name in fields and column not in taken:
            taken.add(column)
            exprs.append(body.struct.field(name).alias(column))
    if "response_format" in fields:
        exprs.extend(_response_format(lf, path, fields["response_format"]))
    return exprs, kind


def _response_format(lf: pl.LazyFrame, path: Path, dtype: pl.DataType) -> list[pl.Expr]:
    """The `json_schema` column from body.response_format: from JSON text (the rows that
    are sent), or, from the whole-file scan's struct, only its types checked."""
    field = pl.col("body").struct.field("response_format")
    if dtype == pl.String:
        return [field.map_elements(lambda text: schema_of(text, path), return_dtype=pl.String,
                                   skip_nulls=True).alias("json_schema")]
    if not isinstance(dtype, pl.Struct) or "type" not in {f.name for f in dtype.fields}:
        raise BatchInputError(f"prompts: {path}: body.response_format must be an object with "
                              f"a `type` ({', '.join(RESPONSE_TYPES)})")
    untyped = (lf.filter(field.is_not_null() & field.struct.field("type").is_null())
               .select(pl.col("custom_id")).head(1).collect())
    if untyped.height:
        raise BatchInputError(f"prompts: {path} (id {untyped['custom_id'][0]!r}): "
                              "body.response_format has no `type`; give one of "
                              f"{', '.join(RESPONSE_TYPES)}")
    kinds = lf.select(field.struct.field("type").unique()).collect().to_series().to_list()
    bad = sorted(str(k) for k in kinds if k is not None and k not in RESPONSE_TYPES)
    if bad:
        raise BatchInputError(f"prompts: {path}: body.response_format type {bad[0]!r} is not "
                              f"supported here; use one of {', '.join(RESPONSE_TYPES)}")
    if "json_schema" in kinds:
        inner = {f.name for f in getattr(_field_dtype(dtype, "json_schema"), "fields", [])}
        missing = (lf.filter((field.struct.field("type") == "json_schema")
                             & (field.struct.field("json_schema").struct.field("schema")
                                .is_null() if "schema" in inner else pl.lit(True)))
                   .select(pl.col("custom_id")).head(1).collect())
        if missing.height:
            raise BatchInputError(f"prompts: {path} (id {missing['custom_id'][0]!r}): "
                                  "body.response_format of type json_schema needs "
                                  "json_schema.schema")
    return []


def _field_dtype(dtype: pl.Struct, name: str) -> Any:
    return next((f.dtype for f in dtype.fields if f.name == name), None)


def schema_of(text: str, path: Path) -> str | None:
    """SGLang's `json_schema` sampling parameter for one row's response_format, as its OpenAI
    server makes it (serving_completions.py / serving_chat.py of 0.5.17)."""
    fmt = json.loads(text)
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return '{"type": "object"}'
    if kind == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema")
        if schema is not None:
            return schema if isinstance(schema, str) else json.dumps(schema)
    raise BatchInputError(f"prompts: {path}: body.response_format {text[:80]} is not one this "
                          f"pipeline applies ({', '.join(RESPONSE_TYPES)} with its schema)")
