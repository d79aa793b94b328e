"""One prompt as an HTTP request to SGLang, and its answer as output columns.

Kept apart from the dispatcher (which decides where and when a request goes) because what a
row may ask for — sampling, chat messages, token ids — grows with what users generate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from infra.output_row import Answer, OutputRow
from infra.prompt_row import PromptRow


class MalformedAnswer(Exception):
    """A 200 whose body is not the answer SGLang gives: retried like a transient failure."""


@dataclass(frozen=True)
class DispatchOptions:
    model: str
    api_key: str | None
    sampling: dict[str, Any]  # job defaults: max_new_tokens, temperature, top_p, seed, ...
    request_timeout_s: float
    max_attempts: int
    backoff_s: float
    samples: int = 1  # n: output rows per prompt, sample_index 0..n-1
    keep_input_columns: bool = True
    prefix_key_chars: int = 0  # prefix affinity (tasks/affinity.py); 0: off
    vocab_size: int | None = None  # the model's; None: token ids go unchecked
    # the engine's request and answer shapes (tasks/engines: `Engine.requests`)
    shapes: RequestShapes = field(default_factory=lambda: SGLangRequests())
    # deaths of relaunched servers that, after every server died on its first batch, prove
    # the fleet cannot serve (tasks/first_batch.py); 0 where this folder saw it already
    first_batch_relaunches: int = 1


class RequestShapes(Protocol):
    def build(self, row: PromptRow, opts: DispatchOptions,
              sample: int = 0) -> tuple[str, dict[str, Any]]: ...

    def parse(self, path: str, body: Any) -> Answer: ...

    def refusal(self, resp: httpx.Response) -> str: ...


def unsendable(row: PromptRow, opts: DispatchOptions) -> str | None:
    """Why a row must not reach the server, or None. Real SGLang 0.5.17's scheduler dies on a
    token id outside the vocabulary (the server is gone, and a retry on the next server kills
    that one too): such a row is an error of its own, named, and never sent."""
    ids = row.input_ids
    if ids is None or opts.vocab_size is None or not ids:
        return None
    if min(ids) >= 0 and max(ids) < opts.vocab_size:  # the hot path: C-level scans only
        return None
    for position, token in enumerate(ids):
        if not 0 <= int(token) < opts.vocab_size:
            return (f"input_ids[{position}]: token id {int(token)} is outside the model's "
                    f"vocabulary (0..{opts.vocab_size - 1}); not sent (SGLang's scheduler "
                    "dies on it)")
    return None


def sampling_for(row: PromptRow, opts: DispatchOptions, sample: int) -> dict[str, Any]:
    """The sampling a row is sent with: job defaults, the row's own columns over them, and
    for sample k of n the seed + k (so samples differ, and each is reproducible)."""
    sampling = {**opts.sampling, **row.sampling_overrides()}
    if row.stop is not None:
        sampling["stop"] = [row.stop] if isinstance(row.stop, str) else list(row.stop)
    elif row.constrained:
        # The grammar decides where a constrained row ends: on real SGLang the job's "\n\n"
        # cut 338 of 400 JSON outputs mid-object (xgrammar allows whitespace inside JSON).
        sampling.pop("stop", None)
    if sample and sampling.get("seed") is not None:
        sampling["seed"] = int(sampling["seed"]) + sample
    if not sampling.get("ignore_eos"):
        sampling.pop("ignore_eos", None)
    return {k: v for k, v in sampling.items() if v is not None and v != []}


def _json_text(schema: Any) -> str:
    """SGLang's native API takes the schema as a JSON string; a column may hold either."""
    return schema if isinstance(schema, str) else json.dumps(schema)


def build_request(row: PromptRow, opts: DispatchOptions,
                  sample: int = 0) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) for one input row (and sample): chat rows go through the server's
    chat template, the rest to /generate; constraints ride along as SGLang names them."""
    sampling = sampling_for(row, opts, sample)
    if row.messages is not None:
        body: dict[str, Any] = {
            "model": opts.model, "messages": row.messages,
            "max_tokens": sampling["max_new_tokens"], "temperature": sampling["temperature"],
            "top_p": sampling["top_p"],
            **{k: sampling[k] for k in ("seed", "ignore_eos", "stop") if k in sampling}}
        if row.json_schema is not None:
            body["response_format"] = response_format(row.json_schema)
        body.update(row.grammar())
        return "/v1/chat/completions", body
    native = ("max_new_tokens", "temperature", "top_p", "ignore_eos", "stop")
    params: dict[str, Any] = {k: sampling[k] for k in native if k in sampling}
    if sampling.get("seed") is not None:
        params["sampling_seed"] = sampling["seed"]
    if row.json_schema is not None:
        params["json_schema"] = _json_text(row.json_schema)
    params.update(row.grammar())
    if row.input_ids is not None:
        return "/generate", {"input_ids": list(row.input_ids), "sampling_params": params}
    return "/generate", {"text": row.prompt, "sampling_params": params}


def response_format(schema: str | dict[str, Any]) -> dict[str, Any]:
    """The OpenAI routes' form of a JSON-schema constraint."""
    return {"type": "json_schema", "json_schema": {
        "name": "row", "schema": json.loads(schema) if isinstance(schema, str) else schema}}


def sent_sampling(body: dict[str, Any]) -> str:
    """The sampling parameters as sent (JSON, keys sorted): the row's provenance."""
    params = body.get("sampling_params")
    if params is None:
        params = {k: v for k, v in body.items() if k not in ("model", "messages")}
    return json.dumps(params, sort_keys=True)


def parse_response(path: str, body: Any) -> Answer:
    """Completion fields from a /generate or OpenAI chat answer; raises on a malformed body."""
    try:
        if path == "/generate":
            meta = body["meta_info"]
            reason = meta.get("finish_reason") or {}
            tokens_only = "text" not in body  # --skip-tokenizer-init answers with ids only
            answer = Answer(
                completion=None if tokens_only else str(body["text"]),
                finish_reason=reason.get("type") if isinstance(reason, dict) else str(reason),
                prompt_tokens=int(meta["prompt_tokens"]),
                completion_tokens=int(meta["completion_tokens"]),
                cached_tokens=int(meta.get("cached_tokens") or 0))
            if tokens_only:
                answer["output_ids"] = [int(t) for t in body["output_ids"]]
            return answer
        choice = body["choices"][0]
        usage = body["usage"]
        return Answer(
            completion=str(choice["message"]["content"]),
            # SGLang's reasoning parser (--reasoning-parser) puts the thinking apart
            reasoning=choice["message"].get("reasoning_content"),
            reasoning_tokens=int(usage.get("reasoning_tokens") or 0),
            finish_reason=str(choice.get("finish_reason")),
            prompt_tokens=int(usage["prompt_tokens"]),
            completion_tokens=int(usage["completion_tokens"]),
            cached_tokens=int((usage.get("prompt_tokens_details") or {}).get(
                "cached_tokens") or 0))
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise MalformedAnswer(
            f"malformed answer from server ({type(exc).__name__}: {exc})") from exc




@dataclass(frozen=True)
class Delivery:
    """How one answer was got: which sample, the body as sent, the server that answered (its
    name, flags fingerprint and SGLang version) and how long it took."""

    sample: int
    body: dict[str, Any]
    server: str
    fingerprint: str  # of the server's flags: the row's `config` column
    version: str | None
    latency_s: float


def output_row(row: PromptRow, opts: DispatchOptions, answer: Answer,
               delivery: Delivery) -> dict[str, Any]:
    """One output row: the user's columns as given (unless keep_input_columns is off), then
    the pipeline's (infra/output_row.py: OutputRow) — the answer and its provenance."""
    given = row.columns if opts.keep_input_columns else {"id": row.id}
    made = OutputRow(sample_index=delivery.sample, **answer, server=delivery.server,
                     config=delivery.fingerprint, model=opts.model,
                     sglang_version=delivery.version,
                     sampling_params=sent_sampling(delivery.body),
                     latency_s=round(delivery.latency_s, 4))
    return {**given, **made}


class SGLangRequests:
    """SGLang's request and answer shapes — native /generate and the OpenAI chat route — as
    the dispatcher uses them; an engine whose server speaks otherwise brings its own
    (tasks/engines/base.py: `Engine.requests`)."""

    def build(self, row: PromptRow, opts: DispatchOptions,
              sample: int = 0) -> tuple[str, dict[str, Any]]:
        return build_request(row, opts, sample)

    def parse(self, path: str, body: Any) -> Answer:
        return parse_response(path, body)

    def refusal(self, resp: httpx.Response) -> str:
        return error_message(resp)


def error_message(resp: httpx.Response) -> str:
    """The server's own words for a refused request (SGLang and OpenAI error bodies)."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:300]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])[:300]
        if "message" in body:
            return str(body["message"])[:300]
    return str(body)[:300]
