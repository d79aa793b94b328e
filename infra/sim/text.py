"""Deterministic completions: the same prompt, seed and sampling parameters give the same text."""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass

from infra.sim.constrained import cut_at_stop, instance

_WORDS = (
    "the model state cache request token batch decode prefill memory slot pool server "
    "throughput latency shard manifest upload plan queue mamba attention layer head "
    "kernel graph prompt answer reason step because therefore which while data train "
    "example value result first second then finally note consider also more less "
).split()
EOS_TOKEN_ID = 151645  # Qwen's <|im_end|>: a built-in profile's; a config folder names its own
# a JSON answer's ids: one below every vocabulary, as the words' are (real SGLang dies on an id
# at or past the model's vocab_size, and a client may feed answers back as prompts)
JSON_TOKEN_ID = len(_WORDS)


@dataclass(frozen=True)
class Completion:
    text: str
    output_ids: list[int]
    completion_tokens: int
    finish_reason: str  # "stop" | "length"
    matched_stop: str | None = None  # the stop string that ended it, if one did


def count_prompt_tokens(text: str) -> int:
    """A tokenizer stand-in: about four bytes of UTF-8 per token."""
    return max(1, len(text.encode()) // 4)


def complete(prompt: str, sampling: dict[str, object], seed: int,
             lengths: tuple[int, int] | None = None) -> Completion:
    """The completion the simulator gives for this prompt, seed and sampling parameters.

    `stop` (strings) and `json_schema` (a parsed schema) are honoured as SGLang does
    (infra/sim/constrained.py); the caller refuses what is not. `lengths` (mean, p99): where
    the answer would reach EOS, lognormal — a reasoning model's spread over two orders of
    magnitude — instead of uniform in 0.3–1.3 × max_new_tokens."""
    key = json.dumps([prompt, sorted(sampling.items(), key=lambda kv: kv[0]), seed],
                     default=str)
    rng = random.Random(hashlib.sha256(key.encode()).digest())
    max_new = int(sampling.get("max_new_tokens") or 128)  # type: ignore[call-overload]
    schema = sampling.get("json_schema")
    if isinstance(schema, dict):
        return _json_completion(schema, rng, max_new)
    wanted = (lognormal_length(rng, *lengths) if lengths
              else max(1, int(max_new * rng.uniform(0.3, 1.3))))
    if sampling.get("ignore_eos"):
        wanted = max_new + 1  # SGLang then always runs to max_new_tokens
    n = min(wanted, max_new)
    ids = [rng.randrange(len(_WORDS)) for _ in range(n)]
    stops = sampling.get("stop") or []
    assert isinstance(stops, list)  # output_controls made it one
    words, matched = cut_at_stop([_WORDS[i] for i in ids], stops)
    if matched is not None:
        return Completion(" ".join(words), ids[:len(words)], max(1, len(words)), "stop", matched)
    return Completion(text=" ".join(words), output_ids=ids, completion_tokens=n,
                      finish_reason="stop" if wanted <= max_new else "length")


def lognormal_params(mean: float, p99: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this mean and 99th percentile (p99 > mean)."""
    z99 = 2.3263478740408408
    sigma = z99 - math.sqrt(z99 * z99 - 2.0 * math.log(p99 / mean))
    return math.log(mean) - sigma * sigma / 2.0, sigma


def lognormal_length(rng: random.Random, mean: int, p99: int) -> int:
    """One length of a lognormal with this mean and 99th percentile."""
    return max(1, round(rng.lognormvariate(*lognormal_params(mean, p99))))


def _json_completion(schema: dict[str, object], rng: random.Random, max_new: int) -> Completion:
    """An instance of the schema as JSON text; cut at max_new_tokens like any output."""
    text = json.dumps(instance(schema, rng, _WORDS))
    tokens = count_prompt_tokens(text)
    if tokens > max_new:
        text = text[: max_new * 4]
        return Completion(text, [JSON_TOKEN_ID] * max_new, max_new, "length")
    return Completion(text, [JSON_TOKEN_ID] * tokens, tokens, "stop")
