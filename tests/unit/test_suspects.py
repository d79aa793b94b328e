"""The suspect lane (tasks/suspects.py): prompts a dying server was running wait out of the
queue and run again one suspect per server, the most implicated first; a prompt implicated in
two deaths is quarantined; one /health verdict per death."""

from __future__ import annotations

import asyncio
import itertools

import httpx
import pytest

from infra.prompt_row import PromptRow
from tasks import suspects
from tasks.dispatch_records import WorkItem
from tasks.suspects import SuspectLane, quarantined

_ids = itertools.count()


def item(*killed: str) -> WorkItem:
    row = PromptRow.from_columns({"id": f"r{next(_ids)}", "prompt": "p"})
    return WorkItem(0, 0, row, killed=list(killed))


def lane() -> tuple[SuspectLane, list[str | None]]:
    woken: list[str | None] = []
    return SuspectLane(woken.append), woken


def test_a_suspect_runs_only_where_no_other_suspect_runs() -> None:
    lanes, woken = lane()
    first, second = item("server-0"), item("server-0")
    lanes.hold(first)
    lanes.hold(second)
    assert woken == [None, None]  # an idle worker of any server is told
    assert lanes.take("server-1") is first
    counted = lanes.started("server-1", first)
    assert lanes.take("server-1") is None  # would share the next death's blame
    assert lanes.take("server-2") is second
    lanes.ended("server-1", counted)
    assert lanes.waiting == 0 and woken == [None, None]  # nothing left to wake for


def test_the_most_implicated_suspect_goes_first_and_its_worker_is_woken() -> None:
    lanes, woken = lane()
    once, twice = item("server-0"), item("server-0", "server-3")
    lanes.hold(once)
    lanes.hold(twice)
    assert lanes.take("server-1") is twice
    counted = lanes.started("server-1", twice)
    lanes.ended("server-1", counted)
    assert woken[-1] == "server-1"  # one still waits: this server has room for it
    assert lanes.take("server-1") is once


def test_a_suspect_waits_for_a_server_it_did_not_kill(monkeypatch: pytest.MonkeyPatch) -> None:
    lanes, _ = lane()
    suspect = item("server-1")
    lanes.hold(suspect)
    assert lanes.take("server-1") is None
    monkeypatch.setattr(suspects, "WAIT_FOR_ANOTHER_SERVER_S", 0.0)
    assert lanes.take("server-1") is suspect  # no other server took it: it runs here


def test_a_prompt_that_becomes_a_suspect_while_running_is_not_uncounted() -> None:
    """It was not counted when it started; its server's death makes it a suspect before it
    ends — the lane must not take away a count it never added."""
    lanes, _ = lane()
    other = item("server-3")
    lanes.hold(other)
    assert lanes.started("server-2", lanes.take("server-2") or item())
    running = item()
    counted = lanes.started("server-2", running)
    running.killed.append("server-2")
    lanes.ended("server-2", counted)
    lanes.hold(item("server-3"))
    assert lanes.take("server-2") is None  # `other` still runs there


def test_two_deaths_quarantine_and_the_reason_names_both_servers() -> None:
    assert quarantined(item("server-0")) is None
    reason = quarantined(item("server-0", "server-2"))
    assert reason is not None and reason.startswith("killed the server twice")
    assert "server-0, server-2" in reason


async def _health_server(answer: bytes | None,
                         asked: list[int] | None = None) -> tuple[asyncio.AbstractServer, str]:
    """A real TCP server on a free port: it answers /health with `answer`, or never; each
    request it reads adds to `asked`."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if asked is not None:
            asked.append(1)
        if answer is None:
            await asyncio.sleep(2)  # busy: accepts, answers nothing within the timeout
        else:
            writer.write(answer)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


@pytest.mark.parametrize(("answer", "died"), [
    (None, False),  # a /health that times out: busy, not dead
    (b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n", True),
    (b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", False),
])
def test_only_a_refused_or_failing_health_is_a_death(monkeypatch: pytest.MonkeyPatch,
                                                      answer: bytes | None, died: bool) -> None:
    monkeypatch.setattr(suspects, "SETTLE_S", 0.0)
    monkeypatch.setattr(suspects, "HEALTH_TIMEOUT_S", 0.3)

    async def check() -> bool:
        server, url = await _health_server(answer)
        async with server, httpx.AsyncClient() as client:
            return await suspects.server_died(client, url)

    assert asyncio.run(check()) is died


def test_a_closed_port_is_a_death(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(suspects, "SETTLE_S", 0.0)

    async def check() -> bool:
        server, url = await _health_server(None)
        server.close()
        await server.wait_closed()
        async with httpx.AsyncClient() as client:
            return await suspects.server_died(client, url)

    assert asyncio.run(check()) is True


DOWN = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n"
UP = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"


def test_every_prompt_a_death_broke_takes_one_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    """200 broken requests, one /health: late checks must not find the relaunch alive."""
    monkeypatch.setattr(suspects, "SETTLE_S", 0.05)

    async def check() -> tuple[list[bool], list[bool], int]:
        asked: list[int] = []
        server, url = await _health_server(DOWN, asked)
        verdicts = suspects.DeathVerdicts()
        async with server, httpx.AsyncClient() as client:
            broke = await asyncio.gather(*(verdicts.died(client, "server-0", url, 0)
                                           for _ in range(200)))
            later = [await verdicts.died(client, "server-0", url, 0)]  # still that death
            once = len(asked)
            later.append(await verdicts.died(client, "server-0", url, 1))  # its relaunch
        return broke, later, once

    broke, later, once = asyncio.run(check())
    assert all(broke) and once == 1
    assert later == [True, True]


def test_a_server_found_alive_is_asked_again_once_the_verdict_is_old(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(suspects, "SETTLE_S", 0.0)

    async def check() -> tuple[bool, bool, int]:
        asked: list[int] = []
        server, url = await _health_server(UP, asked)
        verdicts = suspects.DeathVerdicts()
        async with server, httpx.AsyncClient() as client:
            first = await verdicts.died(client, "server-0", url, 0)
            again = await verdicts.died(client, "server-0", url, 0)  # within the hold
            monkeypatch.setattr(suspects, "VERDICT_HOLDS_S", 0.0)
            await verdicts.died(client, "server-0", url, 0)
        return first, again, len(asked)

    assert asyncio.run(check()) == (False, False, 2)
