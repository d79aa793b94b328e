"""The suspect lane (tasks/suspects.py): prompts a dying server was running ride one per
server, and a prompt implicated in two deaths is quarantined."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from infra.prompt_row import PromptRow
from tasks import suspects
from tasks.dispatch_records import WorkItem
from tasks.suspects import SuspectLane, quarantined


def item(*killed: str) -> WorkItem:
    return WorkItem(0, 0, PromptRow.from_columns({"id": "r1", "prompt": "p"}), killed=list(killed))


def test_a_suspect_runs_only_where_no_other_suspect_runs() -> None:
    lane = SuspectLane()
    first, second, innocent = item("server-0"), item("server-0"), item()
    assert lane.may_run("server-1", first)
    counted = lane.started("server-1", first)
    assert not lane.may_run("server-1", second)  # would share the next death's blame
    assert lane.may_run("server-2", second)
    assert lane.may_run("server-1", innocent)  # prompts never implicated ride anywhere
    lane.ended("server-1", counted)
    assert lane.may_run("server-1", second)


def test_a_prompt_that_becomes_a_suspect_while_running_is_not_uncounted() -> None:
    """It was not counted when it started; its server's death makes it a suspect before it
    ends — the lane must not take away a count it never added."""
    lane = SuspectLane()
    running = item()
    counted = lane.started("server-1", running)
    running.killed.append("server-1")
    lane.ended("server-1", counted)
    assert lane.may_run("server-1", item("server-3"))


def test_two_deaths_quarantine_and_the_reason_names_both_servers() -> None:
    assert quarantined(item("server-0")) is None
    reason = quarantined(item("server-0", "server-2"))
    assert reason is not None and reason.startswith("killed the server twice")
    assert "server-0, server-2" in reason


async def _health_server(answer: bytes | None) -> tuple[asyncio.AbstractServer, str]:
    """A real TCP server on a free port: it answers /health with `answer`, or never."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
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
