"""The suspect lane (tasks/suspects.py): prompts a dying server was running wait out of the
queue and run again in groups that shrink with each death; a prompt implicated in two or more
deaths, the last while alone among suspects, is quarantined."""

from __future__ import annotations

import asyncio
import itertools

import httpx
import pytest

from infra.prompt_row import PromptRow
from tasks import suspects
from tasks.dispatch_records import WorkItem
from tasks.suspects import SuspectLane, group_limit, quarantined

_ids = itertools.count()


def item(*killed: str) -> WorkItem:
    row = PromptRow.from_columns({"id": f"r{next(_ids)}", "prompt": "p"})
    return WorkItem(0, 0, row, killed=list(killed))


def lane(cap: int = 1) -> tuple[SuspectLane, list[str | None]]:
    woken: list[str | None] = []
    return SuspectLane(lambda _server: cap, woken.append), woken


def test_at_a_small_cap_a_suspect_runs_only_where_no_other_suspect_runs() -> None:
    lanes, woken = lane(cap=8)
    first, second = item("server-0"), item("server-0")
    lanes.hold(first)
    lanes.hold(second)
    assert woken == [None, None]  # an idle worker of any server is told
    assert lanes.take("server-1") is first
    counted = lanes.started("server-1", first)
    assert first.alone
    assert lanes.take("server-1") is None  # would share the next death's blame
    assert lanes.take("server-2") is second
    lanes.ended("server-1", counted)
    assert lanes.waiting == 0 and woken == [None, None]  # nothing left to wake for


def test_groups_shrink_eightfold_with_each_death() -> None:
    assert [group_limit(k, 4096) for k in range(1, 6)] == [512, 64, 8, 1, 1]
    assert [group_limit(k, 100) for k in range(1, 3)] == [12, 1]
    lanes, _ = lane(cap=4096)
    for _ in range(600):
        lanes.hold(item("server-0"))
    taken = []
    while (suspect := lanes.take("server-1")) is not None:
        lanes.started("server-1", suspect)
        taken.append(suspect)
    assert len(taken) == 512 and not any(s.alone for s in taken)
    assert lanes.take("server-2") is not None  # another server takes the rest


def test_the_most_implicated_suspect_goes_first_and_keeps_its_group_small() -> None:
    lanes, woken = lane(cap=64)  # groups of 8 after one death, 1 after two
    once, twice = [item("server-0") for _ in range(10)], item("server-0", "server-3")
    for suspect in [*once, twice]:
        lanes.hold(suspect)
    assert lanes.take("server-1") is twice
    counted = lanes.started("server-1", twice)
    assert twice.alone and lanes.take("server-1") is None  # nothing rides beside it
    lanes.ended("server-1", counted)
    assert woken[-1] == "server-1"  # its worker is told there is room again
    group = []
    while (taken := lanes.take("server-1")) is not None:
        lanes.started("server-1", taken)
        group.append(taken)
    assert group == once[:8] and not any(s.alone for s in group)


def test_a_suspect_waits_for_a_server_it_did_not_kill(monkeypatch: pytest.MonkeyPatch) -> None:
    lanes, _ = lane(cap=8)
    suspect = item("server-1")
    lanes.hold(suspect)
    assert lanes.take("server-1") is None
    monkeypatch.setattr(suspects, "WAIT_FOR_ANOTHER_SERVER_S", 0.0)
    assert lanes.take("server-1") is suspect  # no other server took it: it runs where it can


def test_a_prompt_that_becomes_a_suspect_while_running_is_not_uncounted() -> None:
    """It was not counted when it started; its server's death makes it a suspect before it
    ends — the lane must not take away a count it never added."""
    lanes, _ = lane(cap=8)
    running = item()
    counted = lanes.started("server-1", running)
    running.killed.append("server-1")
    lanes.ended("server-1", counted)
    lanes.hold(item("server-3"))
    assert lanes.take("server-1") is not None


def test_two_deaths_quarantine_only_the_last_alone_and_the_reason_names_the_servers() -> None:
    suspect = item("server-0", "server-2")
    assert quarantined(item("server-0")) is None
    assert quarantined(suspect) is None  # died among other suspects: not yet told apart
    suspect.alone = True
    reason = quarantined(suspect)
    assert reason is not None and reason.startswith("killed the server 2 times")
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
