"""Output and error rows as the dispatcher writes them (infra/output_row.py), for tests that
commit shards without a server."""

from __future__ import annotations

from typing import Any

from infra.output_row import Answer
from infra.prompt_row import PromptRow
from tasks.requests import Delivery, DispatchOptions, output_row

OPTS = DispatchOptions("m", None, {}, 30.0, 3, 0.01)


def answered(id: Any, completion: str | None = "x", completion_tokens: int = 1,
             **columns: Any) -> dict[str, Any]:
    """A complete output row for `id`; `columns` override any of them (finish_reason=...)."""
    answer = Answer(completion=completion, finish_reason="stop", prompt_tokens=2,
                    completion_tokens=completion_tokens, cached_tokens=0)
    row = output_row(PromptRow.from_columns({"id": id}), OPTS, answer,
                     Delivery(0, {"text": "p"}, "server-0", "cfg", "0.5.17", 0.1))
    return {**row, **columns}


def failed(id: Any, error: str, attempts: int = 1) -> dict[str, Any]:
    return {"id": id, "sample_index": 0, "error": error, "attempts": attempts}
