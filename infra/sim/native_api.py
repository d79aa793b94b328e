"""Reading SGLang's native /generate body: text or input_ids, one prompt or a batch, and the
fields the simulator refuses (400 naming the field) because it cannot honour them."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse


def is_ids(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(t, int) and not isinstance(t, bool) for t in value))


def generate_prompts(body: dict[str, Any] | None, skip_tokenizer_init: bool,
                      ) -> tuple[list[str | list[int]] | None, bool, str]:
    """The prompts of a native /generate body (text or input_ids, one or a batch), whether
    it was a batch, or None and why not."""
    if body is None:
        return None, False, "request body must be a JSON object"
    ids = body.get("input_ids")
    if ids is not None:
        if is_ids(ids):
            return [ids], False, ""
        if isinstance(ids, list) and ids and all(is_ids(x) for x in ids):
            return list(ids), True, ""
        return None, False, ("`input_ids` must be a non-empty list of token ids (integers) "
                             "or a list of such lists")
    if skip_tokenizer_init:
        return None, False, ("`input_ids` is required: the server runs with "
                             "--skip-tokenizer-init and has no tokenizer for `text`")
    text = body.get("text")
    if isinstance(text, str):
        return [text], False, ""
    if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
        return list(text), True, ""
    return None, False, "`text` (a string or a list of strings) or `input_ids` is required"


def generate_refusal(body: dict[str, Any]) -> str | None:
    """A native field the simulator cannot honour: refused, never ignored."""
    if body.get("stream"):
        return "`stream`: the simulated server does not stream /generate (real SGLang does)"
    sampling = body.get("sampling_params") or {}
    if not isinstance(sampling, dict):
        return "`sampling_params` must be an object"
    for name in ("stop_token_ids", "regex", "ebnf", "n"):
        if sampling.get(name) not in (None, [], 1):
            return (f"`sampling_params.{name}`: the simulated server does not implement it "
                    "(real SGLang does)")
    return None


def bad_request(message: str, openai: bool) -> JSONResponse:
    if openai:
        return JSONResponse({"object": "error", "message": message, "type": "BadRequestError",
                             "param": None, "code": 400}, status_code=400)
    return JSONResponse({"error": {"message": message}}, status_code=400)
