"""What SGLang's radix cache reuses on a hybrid model, per mamba strategy, as measured.

A hybrid model can resume from a cached prefix only where a mamba state was kept, so what is
reusable depends on `--mamba-radix-cache-strategy` (SGLang 0.5.17 on the H200, tiny
Qwen3-Next, 48 groups x 4 prompts sharing a 1,536-token prefix; docs/REAL_SGLANG.md, "the
limits the tuner must respect"):

* extra_buffer keeps states along a cached sequence (every track interval, at chunk
  boundaries): a new prompt reuses the longest cached prefix, to a multiple of 64 tokens here
  (1,536 of 1,536; 1,344 or 1,392 of a 1,400-token prefix). Interleaved groups: 71.5 % of
  prompt tokens cached.
* no_buffer keeps a state only where a cached sequence ends: a prompt that merely branches
  off a cached one reuses nothing (interleaved groups: 5.0 %); one that extends a whole
  cached prompt reuses all of it (the bare prefix sent first: 98.5 %).
* Requests prefilled in one batch share nothing (a group's members sent together: 2.7 %), so
  the scheduler matches a whole batch before inserting it.

The cache lives in the KV pool's free part: what running requests hold is not available to
it (SGLang evicts cached prefixes least-recently-used when a new request needs the tokens).
Through the pipeline on three servers (docs/REAL_SGLANG.md, "prefix affinity") that decided
whether grouping a document's prompts onto one server paid: with each server's running requests
filling its 400,000-token pool, 42.3 % of prompt tokens were reused with affinity off and 42.7 %
on; with 12 clients per server, 27.6 % and 59.0 %.

The simulator's tokens are 4-byte pieces of the prompt (infra/sim/text.py), token ids 4 bytes
each; entries are evicted least-recently-used beyond `room` (the pool's free tokens) or the
pool's size.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict

GRANULE_TOKENS = 64
BYTES_PER_TOKEN = 4


def token_bytes(prompt: str | list[int]) -> bytes:
    """The prompt as the simulator's tokens: 4 bytes each."""
    if isinstance(prompt, list):
        return struct.pack(f"<{len(prompt)}I", *(i & 0xFFFFFFFF for i in prompt))
    return prompt.encode()


class PrefixCache:
    """Cached prefixes of one server; `match` then `insert` per prefilled batch."""

    def __init__(self, strategy: str, capacity_tokens: int, enabled: bool = True) -> None:
        # no_buffer is the one that keeps states only at sequence ends; the others (and a
        # model without mamba layers, "none") resume from any cached prefix
        self.branching = strategy != "no_buffer"
        self.capacity_tokens = capacity_tokens
        self.enabled = enabled
        self._entries: OrderedDict[bytes, int] = OrderedDict()  # digest -> tokens it holds
        self._lengths: dict[int, int] = {}  # no_buffer: cached prompt lengths -> entries
        self._held = 0

    def match(self, data: bytes) -> int:
        """Tokens of `data` the cache already holds (0 when off)."""
        if not self.enabled:
            return 0
        n = len(data) // BYTES_PER_TOKEN
        marks = (range(GRANULE_TOKENS, n + 1, GRANULE_TOKENS) if self.branching
                 else sorted(length for length in self._lengths if length <= n))
        best = 0
        for length, digest in _digests(data, marks):
            if digest in self._entries:
                self._entries.move_to_end(digest)
                best = length
            elif self.branching:
                break  # a radix path: nothing beyond the first miss
        return best

    def insert(self, data: bytes, room: int | None = None) -> None:
        """Cache `data`'s prefixes, then evict down to `room` tokens (the KV pool's part that
        running requests leave free) or the pool's size."""
        if not self.enabled:
            return
        n = len(data) // BYTES_PER_TOKEN
        if self.branching:
            marks: list[int] = list(range(GRANULE_TOKENS, n + 1, GRANULE_TOKENS))
            costs = [GRANULE_TOKENS] * len(marks)
        else:
            marks, costs = [n], [n]
        for (length, digest), cost in zip(_digests(data, marks), costs, strict=True):
            if digest in self._entries:
                self._entries.move_to_end(digest)
                continue
            self._entries[digest] = cost
            self._held += cost
            if not self.branching:
                self._lengths[length] = self._lengths.get(length, 0) + 1
        self.evict_to(self.capacity_tokens if room is None else min(room, self.capacity_tokens))

    def evict_to(self, room: int) -> None:
        """Drop least-recently-used entries until at most `room` tokens are held."""
        while self._held > max(0, room) and self._entries:
            _, tokens = self._entries.popitem(last=False)
            self._held -= tokens
            if not self.branching:  # a whole cached prompt: its length may go from the marks
                self._lengths[tokens] -= 1
                if not self._lengths[tokens]:
                    del self._lengths[tokens]


def _digests(data: bytes, marks: list[int] | range) -> list[tuple[int, bytes]]:
    """(tokens, digest of the first `tokens` tokens) at each mark, in one pass."""
    hasher = hashlib.blake2b(digest_size=16)
    out: list[tuple[int, bytes]] = []
    done = 0
    for length in marks:
        end = length * BYTES_PER_TOKEN
        hasher.update(data[done:end])
        done = end
        out.append((length, hasher.copy().digest()))
    return out
