"""Deterministic completions: the same prompt, seed and sampling parameters give the same text."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass

_WORDS = (
    "the model state cache request token batch decode prefill memory slot pool server "
    "throughput latency shard manifest upload plan queue mamba attention layer head "
    "kernel graph prompt answer reason step because therefore which while data train "
    "example value result first second then finally note consider also more less "
).split()
EOS_TOKEN_ID = 151645


@dataclass(frozen=True)
class Completion:
    text: str
    output_ids: list[int]
    completion_tokens: int
    finish_reason: str  # "stop" | "length"


def count_prompt_tokens(text: str) -> int:
    """A tokenizer stand-in: about four bytes of UTF-8 per token."""
    return max(1, len(text.encode()) // 4)


def complete(prompt: str, sampling: dict[str, object], seed: int) -> Completion:
    """The completion the simulator gives for this prompt, seed and sampling parameters."""
    key = json.dumps([prompt, sorted(sampling.items(), key=lambda kv: kv[0]), seed],
                     default=str)
    rng = random.Random(hashlib.sha256(key.encode()).digest())
    max_new = int(sampling.get("max_new_tokens") or 128)  # type: ignore[call-overload]
    wanted = max(1, int(max_new * rng.uniform(0.3, 1.3)))
    if sampling.get("ignore_eos"):
        wanted = max_new + 1  # SGLang then always runs to max_new_tokens
    n = min(wanted, max_new)
    ids = [rng.randrange(len(_WORDS)) for _ in range(n)]
    text = " ".join(_WORDS[i] for i in ids)
    return Completion(text=text, output_ids=ids, completion_tokens=n,
                      finish_reason="stop" if wanted <= max_new else "length")
