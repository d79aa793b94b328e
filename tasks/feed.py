"""Whether the client machine kept up: the orchestrator's own CPU starvation, measured.

A rate read while the process that feeds the servers waits for a CPU is a measurement of the
client machine, not of the servers' configuration: on a two-core box with another process
holding a core, a canary read that way ended a tuned job at half its start's rate. Linux
counts, per thread, the time it was runnable but waiting on a run queue
(`/proc/self/task/<tid>/schedstat`: nanoseconds on a CPU, then waiting). A thread of this
process that was runnable for a noticeable part of a window (ACTIVE_SHARE of it) and spent
STARVED_SHARE or more of that runnable time waiting ran slowed by that much: the share of the
most-slowed active thread is the window's starvation — near 0 on an idle box, 1 - 1/k with k
busy processes per core. (Threads waiting for the GIL or for I/O sleep: they count neither.)

Each sample of the fleet monitor (tasks/monitor.py) reads it; the watch, the epoch's
measurement and the canary's judge (tasks/tuning/) leave out the time the client was starved
and say so. Where the counters cannot be read (not Linux), nothing is claimed: the share is
None and every window is judged as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

STARVED_SHARE = 0.25  # an active thread waited for a CPU a quarter of its runnable time
ACTIVE_SHARE = 0.05  # runnable (on a CPU or waiting) at least this share of the window
TASKS = Path("/proc/self/task")


@dataclass(frozen=True)
class FeedSample:
    """The client's CPU starvation over the interval that ends at `t` (monitor clock)."""

    t: float
    wait_share: float | None  # the most-slowed active thread's wait / (run + wait), in [0, 1]

    @property
    def starved(self) -> bool:
        return self.wait_share is not None and self.wait_share >= STARVED_SHARE


def thread_times_ns(tasks: Path = TASKS) -> dict[str, tuple[int, int]] | None:
    """Each thread's (ns on a CPU, ns waiting on a run queue) so far, by thread id; None
    where the counters cannot be read."""
    if not tasks.is_dir():
        return None
    out = {}
    for task in tasks.iterdir():
        try:
            fields = (task / "schedstat").read_text().split()
        except OSError:
            continue  # a thread that ended between the listing and the read
        if len(fields) >= 2:
            out[task.name] = (int(fields[0]), int(fields[1]))
    return out or None


def slowed_share(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]],
                 wall_ns: float) -> float:
    """The highest wait / (run + wait) of the threads active over the interval."""
    worst = 0.0
    for tid, (run, wait) in after.items():
        if tid not in before:
            continue
        ran, waited = run - before[tid][0], wait - before[tid][1]
        if ran + waited >= ACTIVE_SHARE * wall_ns and ran + waited > 0:
            worst = max(worst, waited / (ran + waited))
    return worst


class FeedProbe:
    """Reads the starvation since its last reading (the monitor calls it once per tick)."""

    def __init__(self, tasks: Path = TASKS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._tasks = tasks
        self._clock = clock  # what a thread's share of the interval is measured against
        self._last = thread_times_ns(tasks)
        self._last_at = clock()

    def read(self, t: float) -> FeedSample:
        times, now = thread_times_ns(self._tasks), self._clock()
        wall_ns = (now - self._last_at) * 1e9
        share = None
        if times is not None and self._last is not None and wall_ns > 0:
            share = slowed_share(self._last, times, wall_ns)
        self._last, self._last_at = times, now
        return FeedSample(t, share)


def starved_span(feed: list[FeedSample], since: float, until: float) -> float | None:
    """The highest starvation share of any interval ending in (since, until]; None when no
    reading covers the span (unmeasured, not idle)."""
    shares = [f.wait_share for f in feed if since < f.t <= until and f.wait_share is not None]
    return max(shares) if shares else None


def starved_times(feed: list[FeedSample]) -> list[tuple[float, float]]:
    """The (start, end) monitor-clock intervals in which the client was starved."""
    out: list[tuple[float, float]] = []
    previous = None
    for f in sorted(feed, key=lambda f: f.t):
        if f.starved and previous is not None:
            out.append((previous, f.t))
        previous = f.t
    return out


def during(t: float, intervals: list[tuple[float, float]]) -> bool:
    return any(start <= t <= end for start, end in intervals)
