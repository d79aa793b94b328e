"""What the simulated scheduler holds and how it is set up: a request (its lengths, modeled
times, what it reserves), the live mamba states a running one takes, the scheduler's options.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from infra.sim.prefix_cache import PrefixCache

CLIP_MAX_NEW_TOKENS = 4096  # SGLang's SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION


@dataclass
class SimRequest:
    """One request. A served one has a `future` its HTTP handler awaits; a replayed one has
    none, and its `on_done` sends the client's next row (infra/sim/replay.py)."""

    prompt_tokens: int
    target_tokens: int
    future: asyncio.Future[float] | None
    generated: float = 0.0
    arrival: float = field(default_factory=time.monotonic)
    arrived_at: float = 0.0  # modeled clock: queued, admitted, first token
    admitted_at: float | None = None
    first_token_at: float | None = None
    max_new_tokens: int = 0  # what the client allowed (0: the target); sets the reservation
    data: bytes = b""  # the prompt as tokens, for the prefix cache
    cached_tokens: int = 0
    retractions: int = 0
    on_done: Callable[[SimRequest, float], None] | None = None

    def abandoned(self) -> bool:
        """The client went away (SGLang aborts the request and frees its slots)."""
        return self.future is not None and self.future.cancelled()

    def finish(self, clock: float) -> None:
        if self.future is not None and not self.future.done():
            self.future.set_result(clock)
        if self.on_done is not None:
            self.on_done(self, clock)

    def reserve(self) -> int:
        """Tokens SGLang expects this request may still write (before the ratio)."""
        limit = self.max_new_tokens or self.target_tokens
        return min(limit - int(self.generated), CLIP_MAX_NEW_TOKENS)


def tracking_slots(strategy: str, overlap: bool, prefix_state: bool = False) -> int:
    """Live states a running request holds under load, as `mamba num` counts them: 1 working
    + ping-pong copies (reference §2.5), + 1 when the build keeps the request's prefix state
    locked in the radix tree while it runs. SGLang 0.5.17 on the H200 showed exactly 2 per
    request under no_buffer and 4 under extra_buffer (bench/real_sglang/fit.py); seed 000's
    older build showed 3 under extra_buffer."""
    if strategy == "extra_buffer":
        live = 3 if overlap else 2
    elif strategy == "extra_buffer_lazy":
        live = 2
    else:
        live = 1
    return live + (1 if prefix_state else 0)


@dataclass(frozen=True)
class SchedulerOptions:
    """How a simulated server's scheduler behaves beyond its pools and step times.

    `decode_log_interval`: decode steps between log lines (SGLang's default 40).
    `prefix_state`: mamba states at branch points are locked by the prefix cache (0.5.17+).
    `max_chunk_steps`: decode steps modeled as one (None: as many as the next event allows;
    1: exact, for replays). `cache`: the radix cache (None: none). `speed`: < 1 for a
    degraded GPU (fault injection)."""

    decode_log_interval: int = 40
    prefix_state: bool = False
    max_chunk_steps: int | None = None
    cache: PrefixCache | None = None
    speed: float = 1.0


class Turn(NamedTuple):
    """One turn of the scheduler's loop: `chunk` decode steps of `accept` tokens, `modeled`
    seconds (prefill included), the admitted requests' first token at `first_token`."""

    chunk: int
    accept: float
    modeled: float
    first_token: float
