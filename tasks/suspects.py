"""Rows that kill servers: found by riding alone, quarantined once implicated alone twice;
at the job's tail, by group testing.

Some inputs crash a real server every time they are scheduled (a kernel fault; on SGLang
0.5.17 a token id past the vocabulary, which the dispatcher checks before sending, is the
known one). Retried like any lost request, such a row would take down one server after
another. When a server dies, every prompt it was running is implicated — the killer is one of
them. An implicated prompt is a suspect. Suspects wait in the lane, out of the queue (no
worker takes one only to put it back), and run again one per server beside the ordinary
traffic, so the next death on its server implicates it alone among the suspects. A prompt
implicated in KILLS_TO_QUARANTINE or more deaths, the last while it was the only suspect on
its server, is not sent again: it becomes an error row that names the servers, and the rest
of the job runs (the dead servers are relaunched by the tuner, tasks/tuning/repair.py). An
innocent prompt is quarantined only if a second, different killer strikes while it is a
server's one suspect.

One per server costs no death more than two, and while ordinary prompts wait it costs no
throughput either. At the tail it would: a death at a cap of 4,096 implicates 4,096 prompts,
which would trickle through at one per server for hours after the rest is done. So once
nothing else waits (`tail()`), servers take suspects in groups that shrink SPLIT-fold with each
death a suspect was in (4,096: groups of 512, 64, 8, then 1): a group that lives clears all
its members at once, the one that dies narrows the search — a few deaths more, bought with
capacity that would idle. Measured on the simulator: bench/suspect_lane.py,
docs/BENCHMARKS.md.

A broken connection alone is not a death: the server's /health is asked first.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter, deque
from collections.abc import Callable

import httpx

from tasks.dispatch_records import WorkItem

KILLS_TO_QUARANTINE = 2
SPLIT = 8  # at the tail, each death a suspect was in cuts the group it may run in 8-fold
# A suspect waits this long for a server it has not killed (one server alone: then it runs
# where it can), so a second death tells a bad row from a bad server
WAIT_FOR_ANOTHER_SERVER_S = 2.0
SCAN = 64  # suspects looked at per take: the first that may run on the server goes
SETTLE_S = 0.5  # after a broken connection, before asking /health: a dying server's port
HEALTH_TIMEOUT_S = 5.0


def group_limit(kills: int, cap: int) -> int:
    """At the tail, how many suspects may run on one server beside a prompt implicated in
    `kills` deaths, itself included (the server takes `cap` prompts at once)."""
    return max(1, cap // SPLIT ** kills)


class SuspectLane:
    """The suspects waiting to run again, and how many each server runs now. `cap_of(server)`
    is the number of prompts a server takes at once; `wake(server)` wakes an idle worker of
    that server (None: of any), which then asks `take`; `tail()` says nothing else waits."""

    def __init__(self, cap_of: Callable[[str], int], wake: Callable[[str | None], None],
                 tail: Callable[[], bool]) -> None:
        self._cap_of = cap_of
        self._wake = wake
        self._tail = tail
        self._waiting: dict[int, deque[tuple[float, WorkItem]]] = {}  # by kills, oldest first
        self._running: dict[str, Counter[int]] = {}  # server -> the groups its suspects allow
        self.waiting = 0

    def hold(self, item: WorkItem) -> None:
        """A suspect to run again (new, or back after a failure)."""
        self._waiting.setdefault(len(item.killed), deque()).append((time.monotonic(), item))
        self.waiting += 1
        self._wake(None)

    def take(self, server: str) -> WorkItem | None:
        """The suspect `server` may run now, if any: the most implicated first (the likeliest
        killer), in a group no larger than any of its suspects allows, and on a server it has
        killed only once it waited WAIT_FOR_ANOTHER_SERVER_S for another. The group it may
        run in goes on the item (`group`) for `started`."""
        running = self._running.get(server, Counter())
        on, cap, tail = sum(running.values()), self._cap_of(server), self._tail()
        room = min(running, default=cap)
        now = time.monotonic()
        for kills in sorted(self._waiting, reverse=True):
            line = self._waiting[kills]
            i = next((i for i, (since, item) in enumerate(itertools.islice(line, SCAN))
                      if server not in item.killed
                      or now - since >= WAIT_FOR_ANOTHER_SERVER_S), None)
            if i is None:
                continue
            group = min(room, group_limit(kills, cap) if tail else 1)
            if on >= group:  # it waits for this server to empty: none less implicated
                return None  # fills the room first (they kept a killer waiting minutes)
            _, item = line[i]
            del line[i]
            if not line:
                del self._waiting[kills]
            self.waiting -= 1
            item.group = group
            return item
        return None

    def started(self, server: str, item: WorkItem) -> int | None:
        """Count it on `server` if it is a suspect; returns what to hand to `ended` (a prompt
        can become a suspect while it runs)."""
        if not item.killed:
            item.group = 0
            return None
        self._running.setdefault(server, Counter())[item.group] += 1
        return item.group

    def ended(self, server: str, counted: int | None) -> None:
        if counted is not None:
            running = self._running[server]
            running[counted] -= 1
            if not running[counted]:
                del running[counted]
            if self.waiting:
                self._wake(server)  # room for the next suspect


async def server_died(client: httpx.AsyncClient, url: str) -> bool:
    """Whether the server behind a broken connection is gone: its /health refuses or fails.
    A /health that only times out is a busy server (or a starved client), not a dead one: a
    dead SGLang's port refuses. Counted as deaths, the timeouts of a simulated LFM2-8B-A1B
    fleet at cap 4,096 made 75 prompts suspects of servers that never died, and the suspect
    lane then ran them one at a time per server."""
    await asyncio.sleep(SETTLE_S)
    try:
        resp = await client.get(f"{url}/health", timeout=HEALTH_TIMEOUT_S)
    except httpx.TimeoutException:
        return False
    except httpx.TransportError:
        return True
    return resp.status_code != 200


def quarantined(item: WorkItem) -> str | None:
    """The error row's reason once the prompt has been implicated in enough deaths, the last
    with no other suspect on its server; else None."""
    if len(item.killed) < KILLS_TO_QUARANTINE or item.group != 1:
        return None
    return (f"killed the server {len(item.killed)} times ({', '.join(item.killed)} died while "
            "it ran; the last time it was the only suspect there); not sent again — check "
            "this row's input")
