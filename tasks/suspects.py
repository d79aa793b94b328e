"""Rows that kill servers: found by riding alone, quarantined after two deaths.

Some inputs crash a real server every time they are scheduled (a kernel fault; on SGLang
0.5.17 a token id past the vocabulary, which the dispatcher checks before sending, is the
known one). Retried like any lost request, such a row would take down one server after
another. When a server dies, every prompt it was running is implicated — the killer is one of
them. An implicated prompt is a suspect: it runs again, but never beside another suspect on
the same server, so the next death on its server implicates it alone among the suspects.
A prompt implicated in KILLS_TO_QUARANTINE deaths is not sent again: it becomes an error row
that names the servers, and the rest of the job runs (the dead servers are relaunched by the
tuner, tasks/tuning/repair.py). An innocent prompt reaches two only if a second, different
killer strikes while it is that server's one suspect.

Suspects wait in the lane, out of the queue: a worker that took one only to put it back (a
suspect already ran on its server) spun through thousands of them at a cap of 4,096. Groups
of suspects at the job's tail (fewer trickling one per server, more deaths) were measured and
dropped: each death costs the work its server ran and a relaunch, and on the simulator they
made a job slower than one suspect per server (bench/suspect_lane.py, docs/BENCHMARKS.md).

A broken connection alone is not a death: the server's /health is asked first, once per death
(DeathVerdicts).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable

import httpx

from tasks.dispatch_records import WorkItem

KILLS_TO_QUARANTINE = 2
# A suspect waits this long for a server it has not killed (one server alone: then it runs
# where it can), so a second death tells a bad row from a bad server
WAIT_FOR_ANOTHER_SERVER_S = 2.0
SCAN = 64  # suspects looked at per take: the first that may run on the server goes
SETTLE_S = 0.5  # after a broken connection, before asking /health: a dying server's port
HEALTH_TIMEOUT_S = 5.0
VERDICT_HOLDS_S = 10.0  # a server found alive after a broken request: not asked again so soon


class SuspectLane:
    """The suspects waiting to run again, and which servers run one now. `wake(server)`
    wakes an idle worker of that server (None: of any), which then asks `take`."""

    def __init__(self, wake: Callable[[str | None], None]) -> None:
        self._wake = wake
        self._waiting: dict[int, deque[tuple[float, WorkItem]]] = {}  # by kills, oldest first
        self._on: set[str] = set()  # servers running a suspect

    @property
    def waiting(self) -> int:
        return sum(map(len, self._waiting.values()))

    def hold(self, item: WorkItem) -> None:
        """A suspect to run again (new, or back after a failure)."""
        self._waiting.setdefault(len(item.killed), deque()).append((time.monotonic(), item))
        self._wake(None)

    def take(self, server: str) -> WorkItem | None:
        """The suspect `server` may run now, if any: none where one runs; the most implicated
        first (the likeliest killer); on a server it has killed only once it waited
        WAIT_FOR_ANOTHER_SERVER_S for another."""
        if server in self._on:
            return None
        now = time.monotonic()
        for kills in sorted(self._waiting, reverse=True):
            line = self._waiting[kills]
            i = next((i for i, (since, item) in enumerate(itertools.islice(line, SCAN))
                      if server not in item.killed
                      or now - since >= WAIT_FOR_ANOTHER_SERVER_S), None)
            if i is None:
                continue
            _, item = line[i]
            del line[i]
            if not line:
                del self._waiting[kills]  # (no empty line is kept: `if self._waiting` asks)
            return item
        return None

    def started(self, server: str, item: WorkItem) -> bool:
        """Count it on `server` if it is a suspect; True when counted (hand that to ended:
        a prompt can become a suspect while it runs)."""
        if not item.killed:
            return False
        self._on.add(server)
        return True

    def ended(self, server: str, counted: bool) -> None:
        if counted:
            self._on.discard(server)
            if self._waiting:
                self._wake(server)  # room for the next suspect


class DeathVerdicts:
    """One /health verdict for every prompt a server's death broke. Asked once per broken
    request, the 512 checks of a death at cap 512 ran for seconds on a busy client, and the
    late ones could find the relaunched server (same name) healthy: the killer among them
    escaped its death's blame and could run again as an ordinary prompt beside a suspect,
    which would then take the blame alone (an earlier build quarantined a second, innocent
    row on bench/suspect_lane.py once). A death is a death for the rest of that server's
    life (`generation`: its dispatch joins); a verdict of alive holds VERDICT_HOLDS_S only
    (a later break may be a real death)."""

    def __init__(self) -> None:
        self._asked: dict[tuple[str, int], tuple[float, asyncio.Task[bool]]] = {}

    async def died(self, client: httpx.AsyncClient, server: str, url: str,
                   generation: int) -> bool:
        key, now = (server, generation), time.monotonic()
        asked = self._asked.get(key)
        if asked is None or (now - asked[0] > VERDICT_HOLDS_S and not _dead(asked[1])):
            asked = self._asked[key] = (now, asyncio.ensure_future(server_died(client, url)))
        return await asyncio.shield(asked[1])


def _dead(verdict: asyncio.Task[bool]) -> bool:
    """A verdict of dead (one still being asked, or that failed, is not)."""
    return (verdict.done() and not verdict.cancelled() and verdict.exception() is None
            and verdict.result())


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
    """The error row's reason once the prompt has killed enough servers, else None."""
    if len(item.killed) < KILLS_TO_QUARANTINE:
        return None
    return (f"killed the server twice ({', '.join(item.killed)} died while it ran, each time "
            "the only suspect there); not sent again — check this row's input")
