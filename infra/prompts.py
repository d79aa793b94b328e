"""Read and validate the prompt input, streamed with polars (never the whole text in memory).

Accepted: JSONL or Parquet with an `id` column and `prompt` (text), `messages` (chat) or
`input_ids` (pre-tokenized, for servers run with `--skip-tokenizer-init`), or OpenAI batch
JSONL (`custom_id` + `body`). Optional per-row columns override the job's sampling or
constrain the output (REQUEST_COLUMNS); every other column is the user's and travels to the
output unchanged, as does the id's type (an integer id stays an integer). Problems are
reported before any GPU time is spent, naming the row or column.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from infra.openai_batch import BatchInputError, batch_columns, raw_object_columns

SAMPLING_COLUMNS = ("max_new_tokens", "temperature", "top_p", "seed")
# Per-row request fields beyond sampling: stop strings and SGLang's constrained decoding.
CONSTRAINT_COLUMNS = ("stop", "json_schema", "regex", "ebnf")
REQUEST_COLUMNS = SAMPLING_COLUMNS + CONSTRAINT_COLUMNS
# What the pipeline writes next to the input's columns; an input column of the same name
# would be overwritten, so it is refused.
OUTPUT_COLUMNS = ("completion", "output_ids", "finish_reason", "prompt_tokens",
                  "completion_tokens", "cached_tokens", "server", "config", "latency_s",
                  "sample_index", "model", "sglang_version", "sampling_params", "error",
                  "attempts", "reasoning", "reasoning_tokens")


class InputError(ValueError):
    """The input file cannot be used; the message names the file, row or column, and the fix."""


@dataclass(frozen=True)
class InputSummary:
    path: str
    format: str  # jsonl | parquet | openai_batch
    rows: int
    kind: str  # prompt | messages | input_ids
    ids_sha256: str  # fingerprint of the id sequence: a resume against other input fails
    id_dtype: str = "String"  # polars dtype name of the id column, kept in the output


def _scan(path: Path) -> pl.LazyFrame:
    if not path.is_file():
        raise InputError(f"prompts: {path} does not exist; pass --prompts PATH")
    try:
        if path.suffix == ".parquet":
            return pl.scan_parquet(path)
        if path.suffix in (".jsonl", ".ndjson", ".json"):
            return pl.scan_ndjson(path, infer_schema_length=1000)
    except pl.exceptions.PolarsError as exc:
        raise InputError(f"prompts: cannot read {path}: {exc}") from exc
    raise InputError(f"prompts: {path} must end in .jsonl or .parquet")


def _normalize(lf: pl.LazyFrame, path: Path) -> tuple[pl.LazyFrame, str, str]:
    """Map the accepted formats onto columns id + prompt|messages + sampling columns."""
    try:
        cols = lf.collect_schema().names()
    except pl.exceptions.PolarsError as exc:
        raise InputError(f"prompts: {path} is not valid JSONL/Parquet: {_unreadable(path, exc)}"
                         ) from exc
    if "custom_id" in cols and "body" in cols:
        try:
            exprs, kind = batch_columns(lf, path)
            return lf.select(exprs), "openai_batch", kind
        except BatchInputError as exc:
            raise InputError(str(exc)) from exc
        except pl.exceptions.PolarsError as exc:
            raise InputError(f"prompts: {path}: {_unreadable(path, exc)}") from exc
    if "id" not in cols:
        raise InputError(f"prompts: {path} has no `id` column (columns: {', '.join(cols)}); "
                         "add a unique id per row")
    given = [c for c in ("prompt", "messages", "input_ids") if c in cols]
    if len(given) > 1:
        raise InputError(f"prompts: {path} has both `{given[0]}` and `{given[1]}`; give each "
                         "row one of them, and one kind per file (split the file)")
    if "prompt" in cols:
        kind = "prompt"
    elif "messages" in cols:
        kind = "messages"
    elif "input_ids" in cols:
        kind = "input_ids"
    else:
        raise InputError(f"prompts: {path} needs a `prompt`, `messages` or `input_ids` column "
                         f"(columns: {', '.join(cols)})")
    if kind == "prompt" and lf.collect_schema()["prompt"] not in (pl.String, pl.Null):
        raise InputError(f"prompts: {path}: `prompt` is {lf.collect_schema()['prompt']}, not "
                         "text; give each row its prompt as a string (a number is not "
                         "quietly turned into one)")
    clash = [c for c in cols if c in OUTPUT_COLUMNS]
    if clash:
        raise InputError(f"prompts: {path}: column `{clash[0]}` is a name the output uses; "
                         "rename it in the input")
    fmt = "parquet" if path.suffix == ".parquet" else "jsonl"
    return lf, fmt, kind


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _unreadable(path: Path, exc: Exception) -> str:
    """Why polars could not read the file, with the line that breaks it: polars names a
    character offset within its block ("TapeError at character 22"), not the line. Only on
    this error path is the file re-read line by line."""
    if path.suffix == ".parquet" or not path.is_file():
        return _first_line(exc)
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as bad:
                return (f"line {lineno}: {bad.msg} at column {bad.colno}; each line must be "
                        "one JSON object")
    return _first_line(exc)


def open_input(path: Path) -> tuple[pl.LazyFrame, str, str]:
    lf, fmt, kind = _normalize(_scan(path), path)
    return lf, fmt, kind


def validate_input(path: Path) -> InputSummary:
    """Check ids (present, unique, integers or strings), prompts (non-empty) and encoding;
    fingerprint the ids."""
    if path.is_file():
        _check_utf8(path)
    lf, fmt, kind = open_input(path)
    try:
        # JSONL: the whole file decides the id's type, not its first 1,000 rows (one scan)
        source = (pl.scan_ndjson(path, infer_schema_length=None) if fmt == "jsonl" else lf)
        ids = source.select(pl.col("id")).collect()["id"]
        bad = lf.with_row_index("row").filter(_empty(kind)).select("row", "id").head(1).collect()
    except pl.exceptions.PolarsError as exc:
        raise InputError(f"prompts: {path}: {_unreadable(path, exc)}") from exc
    if ids.null_count():
        row = ids.is_null().arg_true()[0]
        raise InputError(f"prompts: {path} row {row}: `id` is missing; give every row an id")
    dup = ~ids.is_first_distinct()
    if dup.any():
        row = dup.arg_true()[0]
        raise InputError(f"prompts: {path} row {row}: duplicate id {ids[row]!r}; ids must be "
                         "unique")
    if bad.height:
        raise InputError(f"prompts: {path} row {bad['row'][0]} (id {bad['id'][0]!r}): empty "
                         f"{kind}; remove the row or fill it")
    _check_max_new_tokens(lf, path, fmt)
    if ids.len() == 0:
        raise InputError(f"prompts: {path} has no rows")
    if not (ids.dtype.is_integer() or ids.dtype == pl.String):
        raise InputError(f"prompts: {path}: `id` is {ids.dtype}; ids must be integers or "
                         "strings (a float id cannot be joined back exactly)")
    digest = hashlib.sha256()
    for chunk in ids.cast(pl.String).to_frame().iter_slices(100_000):
        digest.update("\n".join(chunk["id"].to_list()).encode())
        digest.update(b"\n")
    return InputSummary(str(path), fmt, ids.len(), kind, digest.hexdigest(), str(ids.dtype))


def _check_max_new_tokens(lf: pl.LazyFrame, path: Path, fmt: str) -> None:
    """A row's own max_new_tokens is a whole number of at least 1 (a -3 was accepted, and
    the summary then counted -3 tokens)."""
    if "max_new_tokens" not in lf.collect_schema().names():
        return
    name = "body.max_tokens" if fmt == "openai_batch" else "max_new_tokens"
    col = pl.col("max_new_tokens")
    try:
        low = (lf.with_row_index("row").filter(col.is_not_null() & (col < 1))
               .select("row", "id", "max_new_tokens").head(1).collect())
    except pl.exceptions.PolarsError as exc:
        raise InputError(f"prompts: {path}: `{name}` must be a whole number of tokens "
                         f"({_first_line(exc)})") from exc
    if low.height:
        raise InputError(f"prompts: {path} row {low['row'][0]} (id {low['id'][0]!r}): "
                         f"`{name}` is {low['max_new_tokens'][0]}; it must be at least 1")


def out_of_vocabulary(path: Path, vocab_size: int) -> tuple[int, Any]:
    """(rows whose `input_ids` hold an id outside [0, vocab_size), the first such row's id)."""
    lf, _, kind = open_input(path)
    if kind != "input_ids":
        return 0, None
    ids = pl.col("input_ids")
    bad = lf.filter((ids.list.max() >= vocab_size) | (ids.list.min() < 0)).select("id").collect()
    return bad.height, (bad["id"][0] if bad.height else None)


def _empty(kind: str) -> pl.Expr:
    col = pl.col(kind)
    if kind == "prompt":
        return col.is_null() | (col.str.strip_chars().str.len_chars() == 0)
    return col.is_null() | (col.list.len() == 0)


def _check_utf8(path: Path) -> None:
    if path.suffix == ".parquet":
        return
    with open(path, "rb") as fh:
        for lineno, line in enumerate(fh, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"prompts: {path} line {lineno}: not UTF-8 ({exc.reason} at "
                                 f"byte {exc.start}); re-encode the file as UTF-8") from exc


def iter_rows(path: Path, start: int, stop: int, batch: int = 10_000,
              id_dtype: str = "String") -> Iterator[dict[str, object]]:
    """Rows [start, stop) in input order, as dicts (every column; the id as `id_dtype`, the
    type validation found for the whole file: a block's own inference could differ).

    Truly streamed, with bounded memory whatever the input size: Parquet through pyarrow's
    batch reader (whole row groups before `start` are skipped unread), JSONL in blocks of
    lines, each block parsed by polars and normalized like the full scan."""
    if path.suffix == ".parquet":
        blocks = _parquet_blocks(path, start, stop, batch)
    else:
        blocks = _jsonl_blocks(path, start, stop, batch)
    dtype = getattr(pl, id_dtype)
    for frame in blocks:
        lf, _, _ = _normalize(frame.lazy(), path)
        yield from lf.with_columns(pl.col("id").cast(dtype)).collect().iter_rows(named=True)


def _parquet_blocks(path: Path, start: int, stop: int, batch: int) -> Iterator[pl.DataFrame]:
    import pyarrow.parquet as pq

    reader = pq.ParquetFile(path)
    groups, first = [], 0
    for g in range(reader.metadata.num_row_groups):
        rows = reader.metadata.row_group(g).num_rows
        if first + rows > start and first < stop:
            groups.append(g)
        first += rows
    position = sum(reader.metadata.row_group(g).num_rows
                   for g in range(groups[0])) if groups else stop
    for record_batch in reader.iter_batches(batch_size=batch, row_groups=groups):
        n = record_batch.num_rows
        lo, hi = max(start - position, 0), min(stop - position, n)
        position += n
        if hi > lo:
            frame = pl.from_arrow(record_batch.slice(lo, hi - lo))
            assert isinstance(frame, pl.DataFrame)
            yield frame
        if position >= stop:
            return


def _jsonl_blocks(path: Path, start: int, stop: int, batch: int) -> Iterator[pl.DataFrame]:
    """Blocks of lines, each parsed by polars; JSON schemas as JSON text (polars would give
    one row's schema the other rows' fields as nulls: infra/openai_batch.py)."""
    import io

    index = 0
    block: list[bytes] = []
    with open(path, "rb") as fh:
        for line in fh:
            if not line.strip():
                continue  # polars' scan skips blank lines too: keep row numbers aligned
            if index >= stop:
                break
            if index >= start:
                block.append(raw_object_columns(line))
                if len(block) >= batch:
                    yield pl.read_ndjson(io.BytesIO(b"".join(block)), infer_schema_length=None)
                    block = []
            index += 1
    if block:
        yield pl.read_ndjson(io.BytesIO(b"".join(block)), infer_schema_length=None)
