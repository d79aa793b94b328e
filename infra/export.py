"""Export committed shards as OpenAI batch output JSONL (one line per input, keyed by custom_id;
with n samples per prompt, the samples are that line's choices): chat rows answer as
`chat.completion` bodies, prompt and token-id rows (`/v1/completions`) as `text_completion`.

Streams shard by shard, so the export of a 10M-row job needs one shard in memory at a time.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import polars as pl

from infra.manifest import Manifest
from infra.output_row import GENERATED, ErrorRow, ShardRow


def _ok_line(samples: list[ShardRow], model: str, created: int,
             chat: bool) -> dict[str, Any]:
    """One input row's answer: its n samples as the choices of one completion (with the `id`
    and `created` the openai SDK's models require; created = the shard's commit time)."""
    first = samples[0]
    prompt = first["prompt_tokens"] or 0
    completion = sum(r["completion_tokens"] or 0 for r in samples)
    usage = {"prompt_tokens": prompt, "completion_tokens": completion,
             "total_tokens": prompt + completion}
    choices = [_choice(r, chat) for r in samples]
    return {
        "id": f"batch_req_{first['id']}",
        "custom_id": str(first["id"]),
        "response": {"status_code": 200, "request_id": f"req_{first['id']}", "body": {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{first['id']}", "created": created,
            "object": "chat.completion" if chat else "text_completion",
            "model": first["model"] or model, "choices": choices, "usage": usage}},
        "error": None,
    }


def _choice(row: ShardRow, chat: bool) -> dict[str, Any]:
    index, reason = row["sample_index"] or 0, row["finish_reason"]
    if not chat:  # a server run with --skip-tokenizer-init answers ids only: they ride along
        ids = {"output_ids": row["output_ids"]} if row["completion"] is None and row.get(
            "output_ids") is not None else {}
        return {"index": index, "text": row["completion"] or "", "logprobs": None,
                "finish_reason": reason, **ids}
    message = {"role": "assistant", "content": row["completion"],
               **({"reasoning_content": row["reasoning"]} if row.get("reasoning") else {})}
    return {"index": index, "message": message, "finish_reason": reason}


def _by_id(rows: Iterator[dict[str, Any]]) -> Iterator[list[ShardRow]]:
    """Consecutive rows of one id (a shard keeps each prompt's samples together)."""
    group: list[ShardRow] = []
    for row in map(_shard_row, rows):
        if group and row["id"] != group[0]["id"]:
            yield group
            group = []
        group.append(row)
    if group:
        yield group


def _shard_row(row: dict[str, Any]) -> ShardRow:
    """A row read from a shard, checked to have the pipeline's columns (infra/output_row)."""
    missing = [c.name for c in GENERATED if c.always and c.name not in row]
    if missing:
        raise ValueError(f"a shard row lacks {missing}: not a shard this pipeline wrote")
    return cast(ShardRow, row)


def _error_line(row: ErrorRow) -> dict[str, Any]:
    return {"id": f"batch_req_{row['id']}", "custom_id": str(row["id"]), "response": None,
            "error": {"code": "generation_failed", "message": row["error"]}}


def openai_batch_lines(output: Path, model: str) -> Iterator[str]:
    manifest = Manifest(output)
    kind = manifest.load_plan().input_kind
    for entry in sorted(manifest.committed().values(), key=lambda e: e.shard):
        if entry.rows:
            frame = pl.read_parquet(output / entry.path)
            # plans written before input_kind was recorded: the shard's columns tell
            chat = kind == "messages" if kind else "messages" in frame.columns
            for samples in _by_id(frame.iter_rows(named=True)):
                yield json.dumps(_ok_line(samples, model, int(entry.committed_at), chat))
        if entry.error_path:
            for row in pl.read_parquet(output / entry.error_path).iter_rows(named=True):
                yield json.dumps(_error_line(cast(ErrorRow, row)))


def export_openai_batch(output: Path, target: Path, model: str) -> int:
    """Write the batch output file; returns the number of lines."""
    count = 0
    with _replacing(target) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        for line in openai_batch_lines(output, model):
            fh.write(line + "\n")
            count += 1
    return count


def export_target_problem(target: Path) -> str | None:
    """Why `target` cannot be written as the export file (None: it can), checked before
    any shard is read."""
    if target.is_dir():
        return f"--to: {target} is a folder; give a file path, e.g. {target / 'batch.jsonl'}"
    if not target.parent.is_dir():
        return f"--to: folder {target.parent} does not exist; create it or choose another"
    return None


@contextlib.contextmanager
def _replacing(target: Path) -> Iterator[Path]:
    """A temp file beside `target` that replaces it when the block succeeds and is removed
    when it fails: an export never leaves half a file under either name."""
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        yield tmp
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)


def export_jsonl(output: Path, target: Path) -> int:
    """Every output row with every column (the user's, the generation's, the provenance) as
    JSON lines, shard by shard; error rows are left to errors/ (different columns)."""
    manifest = Manifest(output)
    count = 0
    with _replacing(target) as tmp, open(tmp, "wb") as fh:
        for entry in sorted(manifest.committed().values(), key=lambda e: e.shard):
            if entry.rows:
                frame = pl.read_parquet(output / entry.path)
                frame.write_ndjson(fh)
                count += frame.height
    return count
