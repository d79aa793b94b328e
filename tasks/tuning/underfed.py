"""A window that measures the client machine, not the servers: left out of every judgement.

The client is starved (tasks/feed.py: a thread of the orchestrator waited for a CPU a quarter
of its runnable time or more) *and* a server had room it was not given: nothing queued and
fewer running than its cap. Either alone is no reason: a starved client that keeps every
queue non-empty still feeds the servers, and servers with room beside an unstarved client
are the client's concurrency (`client-bound`, a move the tuner may make).
"""

from __future__ import annotations

from tasks.feed import FeedSample, during, starved_span, starved_times
from tasks.monitor import Sample

ROOM = 0.9  # fewer running than this share of the cap, with nothing queued: room left


def _hungry(sample: Sample, caps: dict[str, int]) -> bool:
    cap = caps.get(sample.server)
    return (sample.alive and (sample.queued or 0) < 1 and cap is not None
            and (sample.running or 0) < ROOM * cap)


def underfed(samples: list[Sample], feed: list[FeedSample], since: float, until: float,
             caps: dict[str, int]) -> str | None:
    """Why [since, until] does not measure the servers (None: it does)."""
    starved = [(a, b) for a, b in starved_times(feed) if b > since and a <= until]
    if not starved:
        return None
    share = starved_span([f for f in feed if f.starved], since, until) or 0.0
    hungry = sorted({s.server for s in samples if since <= s.t <= until
                     and during(s.t, starved) and _hungry(s, caps)})
    if not hungry:
        return None
    return (f"the client was CPU-starved (a thread of it waited for a CPU {share:.0%} of its "
            f"runnable time) while {', '.join(hungry)} had room and nothing queued: the window "
            "measures the client machine, not the servers")


def fed_samples(samples: list[Sample], feed: list[FeedSample],
                caps: dict[str, int]) -> list[Sample]:
    """The samples that measure the servers: those of a server with room and nothing queued
    while the client was starved are left out."""
    starved = starved_times(feed)
    if not starved:
        return samples
    return [s for s in samples if not (during(s.t, starved) and _hungry(s, caps))]
