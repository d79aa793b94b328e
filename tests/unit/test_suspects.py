"""The suspect lane (tasks/suspects.py): prompts a dying server was running wait out of the
queue and run again one per server while other prompts wait, in groups that shrink with each
death at the tail; a prompt implicated in two or more deaths, the last while alone among
suspects, is quarantined."""

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


class Lane:
    """A lane of servers taking `cap` prompts at once; `tail` says nothing else waits."""

    def __init__(self, cap: int, tail: bool = False) -> None:
        self.tail, self.woken = tail, list[str | None]()
        self.lane = SuspectLane(lambda _server: cap, self.woken.append, lambda: self.tail)

    def fill(self, server: str) -> list[WorkItem]:
        """Start every suspect `server` may take now."""
        taken = []
        while (suspect := self.lane.take(server)) is not None:
            self.lane.started(server, suspect)
            taken.append(suspect)
        return taken


def test_while_other_prompts_wait_a_suspect_runs_only_where_no_other_suspect_runs() -> None:
    lanes = Lane(cap=4096)
    first, second = item("server-0"), item("server-0")
    lanes.lane.hold(first)
    lanes.lane.hold(second)
    assert lanes.woken == [None, None]  # an idle worker of any server is told
    assert lanes.fill("server-1") == [first]  # would share the next death's blame
    assert first.group == 1
    assert lanes.fill("server-2") == [second]
    assert lanes.lane.waiting == 0


def test_at_the_tail_groups_shrink_eightfold_with_each_death() -> None:
    assert [group_limit(k, 4096) for k in range(1, 6)] == [512, 64, 8, 1, 1]
    assert [group_limit(k, 100) for k in range(1, 3)] == [12, 1]
    assert group_limit(1, 8) == 1  # at a cap of 8 or less, alone from the first death
    lanes = Lane(cap=4096, tail=True)
    for _ in range(600):
        lanes.lane.hold(item("server-0"))
    group = lanes.fill("server-1")
    assert len(group) == 512 and {s.group for s in group} == {512}
    assert len(lanes.fill("server-2")) == 88  # another server takes the rest


def test_a_suspect_that_started_alone_keeps_its_server_to_itself_at_the_tail() -> None:
    lanes = Lane(cap=4096)
    alone = item("server-0")
    lanes.lane.hold(alone)
    counted = lanes.lane.started("server-1", lanes.lane.take("server-1") or item())
    lanes.tail = True
    lanes.lane.hold(item("server-0"))
    assert lanes.fill("server-1") == []  # its next death must still implicate it alone
    lanes.lane.ended("server-1", counted)
    assert lanes.woken[-1] == "server-1"  # its worker is told there is room again
    assert len(lanes.fill("server-1")) == 1


def test_the_most_implicated_suspect_goes_first_and_keeps_its_group_small() -> None:
    lanes = Lane(cap=64, tail=True)  # groups of 8 after one death, 1 after two
    once, twice = [item("server-0") for _ in range(10)], item("server-0", "server-3")
    for suspect in [*once, twice]:
        lanes.lane.hold(suspect)
    assert lanes.lane.take("server-1") is twice
    counted = lanes.lane.started("server-1", twice)
    assert twice.group == 1 and lanes.lane.take("server-1") is None  # none rides beside it
    lanes.lane.ended("server-1", counted)
    group = lanes.fill("server-1")
    assert group == once[:8] and {s.group for s in group} == {8}


def test_a_suspect_that_must_ride_alone_is_not_starved_by_smaller_suspicions() -> None:
    """A suspect that must run alone waits for its server to empty; no less implicated one
    may keep the server busy meanwhile (on the simulator, a killer waited 2 minutes while
    once-implicated prompts kept both servers occupied)."""
    lanes = Lane(cap=64, tail=True)
    for _ in range(3):
        lanes.lane.hold(item("server-0"))
    first = lanes.fill("server-1")
    assert len(first) == 3
    killer = item("server-0", "server-2")
    lanes.lane.hold(killer)
    lanes.lane.hold(item("server-0"))
    assert lanes.fill("server-1") == []  # the room is not filled past the killer
    for suspect in first:
        lanes.lane.ended("server-1", suspect.group)
    assert lanes.fill("server-1") == [killer] and killer.group == 1


def test_a_suspect_waits_for_a_server_it_did_not_kill(monkeypatch: pytest.MonkeyPatch) -> None:
    lanes = Lane(cap=8)
    suspect = item("server-1")
    lanes.lane.hold(suspect)
    assert lanes.lane.take("server-1") is None
    monkeypatch.setattr(suspects, "WAIT_FOR_ANOTHER_SERVER_S", 0.0)
    assert lanes.lane.take("server-1") is suspect  # no other server took it: it runs here


def test_a_prompt_that_becomes_a_suspect_while_running_is_not_uncounted() -> None:
    """It was not counted when it started; its server's death makes it a suspect before it
    ends — the lane must not take away a count it never added."""
    lanes = Lane(cap=8)
    running = item()
    counted = lanes.lane.started("server-1", running)
    running.killed.append("server-1")
    lanes.lane.ended("server-1", counted)
    lanes.lane.hold(item("server-3"))
    assert lanes.lane.take("server-1") is not None


def test_two_deaths_quarantine_only_the_last_alone_and_the_reason_names_the_servers() -> None:
    suspect = item("server-0", "server-2")
    assert quarantined(item("server-0")) is None
    suspect.group = 8
    assert quarantined(suspect) is None  # died among other suspects: not yet told apart
    suspect.group = 1
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
