"""Export committed shards as OpenAI batch output JSONL (one line per input, keyed by custom_id).

Streams shard by shard, so the export of a 10M-row job needs one shard in memory at a time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl

from infra.ledger import Ledger


def _ok_line(row: dict[str, Any], model: str) -> dict[str, Any]:
    usage = {"prompt_tokens": row.get("prompt_tokens"),
             "completion_tokens": row.get("completion_tokens"),
             "total_tokens": (row.get("prompt_tokens") or 0) + (row.get("completion_tokens") or 0)}
    return {
        "id": f"batch_req_{row['id']}",
        "custom_id": str(row["id"]),
        "response": {"status_code": 200, "request_id": f"req_{row['id']}", "body": {
            "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant",
                                                 "content": row.get("completion")},
                         "finish_reason": row.get("finish_reason")}],
            "usage": usage}},
        "error": None,
    }


def _error_line(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"batch_req_{row['id']}", "custom_id": str(row["id"]), "response": None,
            "error": {"code": "generation_failed", "message": row.get("error")}}


def openai_batch_lines(output: Path, model: str) -> Iterator[str]:
    ledger = Ledger(output)
    for entry in sorted(ledger.committed().values(), key=lambda e: e.shard):
        if entry.rows:
            for row in pl.read_parquet(output / entry.path).iter_rows(named=True):
                yield json.dumps(_ok_line(row, model))
        if entry.error_path:
            for row in pl.read_parquet(output / entry.error_path).iter_rows(named=True):
                yield json.dumps(_error_line(row))


def export_openai_batch(output: Path, target: Path, model: str) -> int:
    """Write the batch output file; returns the number of lines."""
    count = 0
    tmp = target.with_name(f".{target.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for line in openai_batch_lines(output, model):
            fh.write(line + "\n")
            count += 1
    tmp.replace(target)
    return count
