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

A broken connection alone is not a death: the server's /health is asked first.
"""

from __future__ import annotations

import asyncio

import httpx

from tasks.dispatch_records import WorkItem

KILLS_TO_QUARANTINE = 2
# A suspect waits this many hand-ons for a server it has not killed (one server alone: ~2 s,
# then it runs where it can), so a second death tells a bad row from a bad server
PASSES_FOR_ANOTHER_SERVER = 40
SETTLE_S = 0.5  # after a broken connection, before asking /health: a dying server's port
HEALTH_TIMEOUT_S = 5.0


class SuspectLane:
    """Which servers run a suspect now: at most one each."""

    def __init__(self) -> None:
        self._on: dict[str, int] = {}
        self._passed: dict[int, int] = {}

    def may_run(self, server: str, item: WorkItem) -> bool:
        """Any prompt that killed nothing; a suspect where no other suspect runs, and on a
        server it has not killed while another may take it."""
        if not item.killed:
            return True
        if self._on.get(server, 0):
            return False
        if server in item.killed:
            passed = self._passed.get(id(item), 0)
            if passed < PASSES_FOR_ANOTHER_SERVER:
                self._passed[id(item)] = passed + 1
                return False
        return True

    def started(self, server: str, item: WorkItem) -> bool:
        """Count it on `server` if it is a suspect; True when counted (hand that to ended:
        a prompt can become a suspect while it runs)."""
        if not item.killed:
            return False
        self._on[server] = self._on.get(server, 0) + 1
        return True

    def ended(self, server: str, counted: bool) -> None:
        if counted:
            self._on[server] -= 1


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
