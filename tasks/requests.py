"""One prompt as an HTTP request to SGLang, and its answer as output columns.

Kept apart from the dispatcher (which decides where and when a request goes) because what a
row may ask for — sampling, chat messages, token ids — grows with what users generate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class MalformedAnswer(Exception):
    """A 200 whose body is not the answer SGLang gives: retried like a transient failure."""


@dataclass(frozen=True)
class DispatchOptions:
    model: str
    api_key: str | None
    sampling: dict[str, Any]
    request_timeout_s: float
    max_attempts: int
    backoff_s: float


def build_request(row: dict[str, Any], opts: DispatchOptions) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) for one input row; per-row sampling columns override job defaults."""
    sampling = dict(opts.sampling)
    for key in ("max_new_tokens", "temperature", "top_p", "seed"):
        if row.get(key) is not None:
            sampling[key] = row[key]
    if "messages" in row and row.get("messages") is not None:
        body: dict[str, Any] = {
            "model": opts.model, "messages": row["messages"],
            "max_tokens": sampling["max_new_tokens"], "temperature": sampling["temperature"],
            "top_p": sampling["top_p"],
        }
        if sampling.get("seed") is not None:
            body["seed"] = sampling["seed"]
        if sampling.get("ignore_eos"):
            body["ignore_eos"] = True
        return "/v1/chat/completions", body
    params = {k: sampling[k] for k in ("max_new_tokens", "temperature", "top_p")}
    if sampling.get("seed") is not None:
        params["sampling_seed"] = sampling["seed"]
    if sampling.get("ignore_eos"):
        params["ignore_eos"] = True
    if row.get("input_ids") is not None:
        return "/generate", {"input_ids": list(row["input_ids"]), "sampling_params": params}
    return "/generate", {"text": row["prompt"], "sampling_params": params}


def parse_response(path: str, body: Any) -> dict[str, Any]:
    """Completion fields from a /generate or OpenAI chat answer; raises on a malformed body."""
    try:
        if path == "/generate":
            meta = body["meta_info"]
            reason = meta.get("finish_reason") or {}
            tokens_only = "text" not in body  # --skip-tokenizer-init answers with ids only
            return {
                "completion": None if tokens_only else str(body["text"]),
                **({"output_ids": [int(t) for t in body["output_ids"]]} if tokens_only else {}),
                "finish_reason": reason.get("type") if isinstance(reason, dict) else str(reason),
                "prompt_tokens": int(meta["prompt_tokens"]),
                "completion_tokens": int(meta["completion_tokens"]),
            }
        choice = body["choices"][0]
        usage = body["usage"]
        return {
            "completion": str(choice["message"]["content"]),
            "finish_reason": str(choice.get("finish_reason")),
            "prompt_tokens": int(usage["prompt_tokens"]),
            "completion_tokens": int(usage["completion_tokens"]),
        }
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise MalformedAnswer(
            f"malformed answer from server ({type(exc).__name__}: {exc})") from exc


