"""The output row, defined once: what the pipeline adds after the user's own columns, with
types and which rows have them. The Parquet schema of a shard, the export's reading of a
row, the dispatcher's building of one and docs/OUTPUT.md are all made from the TypedDicts
below, so no column's type is left to Parquet's inference and no column exists by
convention only.

`python -m infra.output_row` prints docs/OUTPUT.md; a test keeps the file equal to it.
"""

from __future__ import annotations

import io
import sys
import types
from dataclasses import dataclass
from typing import (
    Annotated,
    Any,
    NotRequired,
    TypedDict,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

import polars as pl


class Answer(TypedDict):
    """What the server answered, as columns."""

    completion: Annotated[str | None, "the answer's text; null from a server run with "
                                      "--skip-tokenizer-init (then `output_ids`)"]
    output_ids: NotRequired[Annotated[list[int], "the answer as token ids, from a server "
                                                 "that answers ids only"]]
    reasoning: NotRequired[Annotated[str | None, "chat rows: the thinking, apart from the "
                                                 "answer (SGLang's --reasoning-parser)"]]
    reasoning_tokens: NotRequired[Annotated[int, "chat rows: tokens of `reasoning`"]]
    finish_reason: Annotated[str | None, "`stop` (end of sequence or a stop string) or "
                                         "`length` (max_new_tokens)"]
    prompt_tokens: Annotated[int, "tokens of the prompt (chat template included)"]
    completion_tokens: Annotated[int, "tokens generated"]
    cached_tokens: Annotated[int, "prompt tokens the server's prefix cache reused"]


class Provenance(TypedDict):
    """How the row was made."""

    server: Annotated[str, "the server that answered (`server-I`)"]
    config: Annotated[str, "fingerprint of that server's flags (summary.json lists them)"]
    model: Annotated[str, "the model"]
    sglang_version: Annotated[str | None, "the server's SGLang version, as it reports it"]
    sampling_params: Annotated[str, "the sampling parameters exactly as sent (JSON)"]
    latency_s: Annotated[float, "seconds from sending the request to its answer"]


class Sample(TypedDict):
    sample_index: Annotated[int, "which of the row's `sampling.n` samples (0 … n−1)"]


class OutputRow(Sample, Answer, Provenance):
    """The pipeline's columns of one row of `shards/`, after the user's own (`id` first)."""


class ShardRow(OutputRow):
    """A row as read back from `shards/` (the export): the input's `id`, which is always
    kept, and the pipeline's columns; the user's other columns ride along untyped."""

    id: Any


class ErrorRow(TypedDict):
    """One row of `errors/`: a prompt (sample) that failed for good, and why."""

    id: Annotated[Any, "the row's id, as in the input"]
    sample_index: Annotated[int, "which sample failed"]
    error: Annotated[str, "why: the server's own words, or the pipeline's (never sent, "
                          "quarantined, attempts used up)"]
    attempts: Annotated[int, "requests made for it"]


@dataclass(frozen=True)
class Column:
    name: str
    dtype: pl.DataType | None  # None: the input's type (the id)
    nullable: bool  # the value may be null
    always: bool  # False: only some rows have the column (a shard without them has none)
    about: str


_DTYPES: dict[Any, pl.DataType] = {str: pl.String(), int: pl.Int64(), float: pl.Float64(),
                                   bool: pl.Boolean()}


def columns(row_type: type) -> list[Column]:
    """The columns a TypedDict above declares, in order."""
    hints = get_type_hints(row_type, include_extras=True)
    out = []
    for name, hint in hints.items():
        # (read from the hint: with postponed annotations 3.11's __required_keys__ lists
        # every key)
        always = get_origin(hint) is not NotRequired
        if not always:
            hint = get_args(hint)[0]
        kind, about = get_args(hint)[0], get_args(hint)[1]
        nullable = get_origin(kind) in (Union, types.UnionType) and type(None) in get_args(kind)
        if nullable:
            kind = next(a for a in get_args(kind) if a is not type(None))
        out.append(Column(name, _dtype(kind), nullable, always, about))
    return out


def _dtype(kind: Any) -> pl.DataType | None:
    if get_origin(kind) is list:
        inner = _DTYPES[get_args(kind)[0]]
        return pl.List(inner)
    return _DTYPES.get(kind)


GENERATED = columns(OutputRow)
ERRORS = columns(ErrorRow)


def parquet_bytes(rows: list[dict[str, Any]], declared: list[Column]) -> bytes:
    """A shard as Parquet: the declared columns with their declared types (an all-null
    `sglang_version` stays a string column), the user's as the input gave them."""
    buf = io.BytesIO()
    if not rows:
        pl.DataFrame({"id": pl.Series([], dtype=pl.String)}).write_parquet(buf)
        return buf.getvalue()
    every = set.intersection(*(set(r) for r in rows))
    missing = [c.name for c in declared if c.always and c.name not in every]
    if missing:
        raise ValueError(f"output rows lack the columns {missing} (infra/output_row.py)")
    present = set().union(*(r.keys() for r in rows))
    overrides = {c.name: c.dtype for c in declared if c.dtype is not None and c.name in present}
    pl.DataFrame(rows, infer_schema_length=None, schema_overrides=overrides).write_parquet(buf)
    return buf.getvalue()


def markdown() -> str:
    """docs/OUTPUT.md."""
    lines = ["# Output columns", "",
             "Made by `python -m infra.output_row` from `infra/output_row.py`, the one "
             "definition the", "shards' Parquet schema, the export and the dispatcher use. "
             "Every row of `shards/` has", "your input's columns first (`id` and the rest, as "
             "given, unless `keep_input_columns = false`", "keeps `id` only), then these:", ""]
    lines += _table(GENERATED)
    lines += ["", "Rows that failed for good are in `errors/`, with these columns:", ""]
    lines += _table(ERRORS)
    return "\n".join(lines) + "\n"


def _table(cols: list[Column]) -> list[str]:
    out = ["| column | type | in | about |", "|---|---|---|---|"]
    for c in cols:
        kind = "the input's" if c.dtype is None else str(c.dtype)
        kind += ", may be null" if c.nullable else ""
        out.append(f"| `{c.name}` | {kind} | {'every row' if c.always else 'some rows'} "
                   f"| {c.about} |")
    return out


if __name__ == "__main__":
    sys.stdout.write(markdown())
