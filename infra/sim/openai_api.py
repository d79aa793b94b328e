"""The simulator's OpenAI-compatible endpoints, shaped like SGLang 0.5.17's answers.

Recorded from real SGLang on the H200 (tests/fixtures/sglang-0.5.17/tiny.answers.json): the
model name is echoed as given (an unknown one is not refused), `n` choices share one prompt
count, streams end with a chunk that carries the finish reason, then `data: [DONE]`. What the
simulator does not implement is refused with a 400 naming the field, never ignored.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from infra.sim.constrained import output_controls
from infra.sim.native_api import is_ids

# Fields that would change the answer's length or shape, which the simulator cannot honour.
UNSUPPORTED = ("stop_token_ids", "logprobs", "top_logprobs", "echo", "suffix",
               "best_of", "logit_bias", "tools", "tool_choice", "regex", "json_schema",
               "ebnf", "lora_path")
MAX_N = 16

Prompt = str | list[int]
Generate = Callable[[Prompt, dict[str, Any], Request], Awaitable[dict[str, Any]]]


def bad_request(message: str) -> JSONResponse:
    return JSONResponse({"object": "error", "message": message, "type": "BadRequestError",
                         "param": None, "code": 400}, status_code=400)


def prompts_of(body: dict[str, Any], chat: bool) -> tuple[list[Prompt] | None, str]:
    """The prompts (chat: the messages through the model's template; completions: a string,
    token ids, or a list of either, as OpenAI and SGLang accept), or None and why not."""
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            return None, "`messages` must be a non-empty list"
        return ["".join(f"<|im_start|>{m.get('role')}\n{m.get('content')}<|im_end|>\n"
                        for m in msgs if isinstance(m, dict)) + "<|im_start|>assistant\n"], ""
    raw = body.get("prompt")
    if isinstance(raw, str):
        return [raw], ""
    if isinstance(raw, list) and is_ids(raw):
        return [[int(t) for t in raw]], ""
    if isinstance(raw, list) and raw and all(isinstance(p, str) or is_ids(p) for p in raw):
        return list(raw), ""
    return None, ("`prompt` must be a string, a list of token ids, or a non-empty list of "
                  "either")


def refusal(body: dict[str, Any]) -> str | None:
    for name in UNSUPPORTED:
        if body.get(name) not in (None, False, [], {}):
            return f"`{name}`: the simulated server does not implement it (real SGLang does)"
    fmt = body.get("response_format")
    if fmt not in (None, {}) and not (isinstance(fmt, dict) and fmt.get("type") in (
            "text", "json_schema") and (fmt.get("type") == "text" or isinstance(
            (fmt.get("json_schema") or {}).get("schema"), dict))):
        return ("`response_format`: the simulated server honours {\"type\": \"json_schema\", "
                "\"json_schema\": {\"schema\": {...}}} and \"text\" only (real SGLang does more)")
    n = body.get("n", 1)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        return f"`n` must be an integer from 1 to {MAX_N}"
    return None


def sampling_of(body: dict[str, Any], sample: int) -> dict[str, Any]:
    sampling: dict[str, Any] = {
        "max_new_tokens": body.get("max_tokens") or body.get("max_completion_tokens") or 128,
        "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0)}
    if body.get("seed") is not None:
        sampling["sampling_seed"] = body["seed"]
    if body.get("ignore_eos"):
        sampling["ignore_eos"] = True
    if sample:
        sampling["n_index"] = sample  # each of the n samples is drawn apart
    if body.get("stop") is not None:
        sampling["stop"] = body["stop"]
    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        sampling["json_schema"] = fmt["json_schema"]["schema"]
    return output_controls(sampling)


def _choice(index: int, out: dict[str, Any], chat: bool) -> dict[str, Any]:
    reason = out["meta_info"]["finish_reason"]["type"]
    choice: dict[str, Any] = {"index": index}
    if chat:
        choice["message"] = {"role": "assistant", "content": out["text"],
                             "reasoning_content": None, "tool_calls": None}
    else:
        choice["text"] = out["text"]
    choice.update({"logprobs": None, "finish_reason": reason,
                   "matched_stop": out["meta_info"]["finish_reason"].get("matched")
                   if reason == "stop" else None})
    return choice


def _usage(outs: list[dict[str, Any]], n: int = 1) -> dict[str, Any]:
    prompt = sum(o["meta_info"]["prompt_tokens"] for o in outs[::n])  # once per prompt
    completion = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion,
            "completion_tokens": completion, "prompt_tokens_details": None,
            "reasoning_tokens": 0}


async def respond(body: dict[str, Any], chat: bool, model: str, request: Request,
                  generate: Generate) -> Response:
    """The answer to one /v1/completions or /v1/chat/completions body."""
    prompts, problem = prompts_of(body, chat)
    problem = problem or refusal(body) or ""
    if prompts is None or problem:
        return bad_request(problem)
    n = int(body.get("n", 1))
    # OpenAI's order: every sample of the first prompt, then of the next.
    outs = list(await asyncio.gather(*(generate(prompt, sampling_of(body, i), request)
                                       for prompt in prompts for i in range(n))))
    name: str = body["model"] if isinstance(body.get("model"), str) else model
    if body.get("stream"):
        return StreamingResponse(_stream(outs, chat, name, body, n),
                                 media_type="text/event-stream")
    return JSONResponse({
        "id": "_".join(o["meta_info"]["id"] for o in outs),
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()), "model": name,
        "choices": [_choice(i, o, chat) for i, o in enumerate(outs)],
        "usage": _usage(outs, n), "metadata": {"weight_version": "default"}})


async def _stream(outs: list[dict[str, Any]], chat: bool, model: str,
                  body: dict[str, Any], n: int) -> AsyncIterator[str]:
    """One chunk per output token and choice; the last carries the finish reason."""
    rid, created = uuid.uuid4().hex, int(time.time())
    kind = "chat.completion.chunk" if chat else "text_completion"
    for index, out in enumerate(outs):
        words = out["text"].split(" ")
        pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
        reason = out["meta_info"]["finish_reason"]["type"]
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            part: dict[str, Any] = ({"delta": {"role": "assistant", "content": piece}}
                                    if chat else {"text": piece})
            choice = {"index": index, **part, "logprobs": None,
                      "finish_reason": reason if last else None,
                      "matched_stop": out["meta_info"]["finish_reason"].get("matched")
                      if last and reason == "stop" else None}
            chunk = {"id": rid, "object": kind, "created": created, "model": model,
                     "choices": [choice], "usage": None}
            yield f"data: {json.dumps(chunk)}\n\n"
    if (body.get("stream_options") or {}).get("include_usage"):
        chunk = {"id": rid, "object": kind, "created": created, "model": model,
                 "choices": [], "usage": _usage(outs, n)}
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"
