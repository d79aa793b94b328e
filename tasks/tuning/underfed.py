"""A window that measures the client machine, not the servers: left out of every judgement.

The client is starved (tasks/feed.py: a thread of the orchestrator waited for a CPU a quarter
of its runnable time or more) *and* a server had room it was not given in most of the
window's scrapes of it: nothing queued and fewer running than it may be given (its cap, or
the client's concurrency per server where that is lower). Either alone is no reason: a
starved client that keeps every queue non-empty still feeds the servers, and servers with
room beside an unstarved client are the client's concurrency (`client-bound`, a move the
tuner may make).
"""

from __future__ import annotations

from tasks.feed import FeedSample, during, starved_span, starved_times
from tasks.monitor import Sample

ROOM = 0.9  # fewer running than this share of what it may be given, nothing queued: room
# A server is left unfed when most of its scrapes in the window found it with room while the
# client starved. One scrape is no evidence: a batch admitted at once finishes at once, and
# the moment before the client sends the next ones reads empty on any machine.
HUNGRY_SHARE = 0.5


def feedable(caps: dict[str, int], concurrency: dict[str, int | None]) -> dict[str, int]:
    """What each server may be given at once: its cap, or the client's concurrency for it
    where that is lower (a server held below its cap by the client's setting is not starved
    by the client machine)."""
    return {name: min(cap, concurrency.get(name) or cap) for name, cap in caps.items()}


def _unfed(sample: Sample, starved: list[tuple[float, float]], room: dict[str, int]) -> bool:
    """Scraped while the client starved, with nothing queued and room it was not given."""
    most = room.get(sample.server)
    return (during(sample.t, starved) and sample.alive and (sample.queued or 0) < 1
            and most is not None and (sample.running or 0) < ROOM * most)


def underfed(samples: list[Sample], feed: list[FeedSample], since: float, until: float,
             room: dict[str, int]) -> str | None:
    """Why [since, until] does not measure the servers (None: it does); `room`: what each
    server may be given at once (`feedable`)."""
    starved = [(a, b) for a, b in starved_times(feed) if b > since and a <= until]
    if not starved:
        return None
    share = starved_span([f for f in feed if f.starved], since, until) or 0.0
    hungry = _unfed_servers([s for s in samples if since <= s.t <= until], starved, room)
    if not hungry:
        return None
    return (f"the client was CPU-starved (a thread of it waited for a CPU {share:.0%} of its "
            f"runnable time) while {', '.join(hungry)} had room and nothing queued: the window "
            "measures the client machine, not the servers")


def _unfed_servers(samples: list[Sample], starved: list[tuple[float, float]],
                   room: dict[str, int]) -> list[str]:
    """The servers most of whose samples found them with room while the client starved."""
    seen: dict[str, list[bool]] = {}
    for s in samples:
        seen.setdefault(s.server, []).append(_unfed(s, starved, room))
    return sorted(name for name, flags in seen.items()
                  if sum(flags) >= HUNGRY_SHARE * len(flags))


def fed_samples(samples: list[Sample], feed: list[FeedSample],
                room: dict[str, int]) -> list[Sample]:
    """The samples that measure the servers: those of a server with room and nothing queued
    while the client was starved are left out."""
    starved = starved_times(feed)
    if not starved:
        return samples
    return [s for s in samples if not _unfed(s, starved, room)]
