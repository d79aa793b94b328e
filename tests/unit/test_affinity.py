"""Prefix affinity: one server per prefix, its leader first, no server left idle."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from infra.prompt_row import PromptRow
from tasks.affinity import AffinityQueue, owner, prefix_key

PREFIX = "You are grading answers about state caches. " * 40  # 1,800 characters


@dataclass(eq=False)
class Item:
    row: PromptRow = field(default_factory=lambda: PromptRow(None, prompt=""))


def group(prefix: str, n: int) -> list[Item]:
    return [Item(PromptRow(k, prompt=f"{prefix}Question {k}?")) for k in range(n)]


def queued_group(n: int, leader_wait_s: float) -> tuple[AffinityQueue, list[Item], str, str]:
    """A queue over two servers holding one group of n: (queue, items, its server, the other)."""
    queue = AffinityQueue(1024, lambda: ["s0", "s1"], leader_wait_s=leader_wait_s)
    items = group(PREFIX, n)
    for item in items:
        queue.put(item)
    home = owner(prefix_key(items[0].row, 1024) or "", ["s0", "s1"])
    return queue, items, home, "s1" if home == "s0" else "s0"


def test_the_key_is_the_head_of_the_prompt_and_short_prompts_have_none() -> None:
    a, b = group(PREFIX, 2)
    assert prefix_key(a.row, 1024) == prefix_key(b.row, 1024)
    assert prefix_key(PromptRow(1, prompt="short"), 1024) is None
    assert prefix_key(a.row, 0) is None  # affinity off
    ids = PromptRow(1, input_ids=list(range(400)))
    assert prefix_key(ids, 1024) == prefix_key(PromptRow(2, input_ids=[*range(256), 7, 7]), 1024)
    assert prefix_key(PromptRow(1, input_ids=list(range(100))), 1024) is None
    chat = PromptRow(1, messages=[{"role": "system", "content": PREFIX},
                                  {"role": "user", "content": "hi"}])
    assert prefix_key(chat, 1024) == prefix_key(PromptRow(2, prompt=PREFIX), 1024)


def test_rendezvous_owner_moves_only_the_keys_of_a_server_that_left() -> None:
    keys = [f"k{i}" for i in range(400)]
    before = {k: owner(k, ["s0", "s1", "s2", "s3"]) for k in keys}
    after = {k: owner(k, ["s0", "s1", "s2"]) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == "s3" for k in moved)
    assert 60 < sum(1 for k in keys if before[k] == "s0") < 140  # roughly balanced


def test_followers_wait_for_their_leader_then_go_to_its_server() -> None:
    async def scenario() -> None:
        queue, items, home, other = queued_group(4, leader_wait_s=60)
        assert queue.qsize() == 4
        leader = await queue.get(home)
        assert leader is items[0]
        # the followers are held: neither server gets one before the leader is answered
        for name in (home, other):
            assert queue._take(name) is None
        queue.done(leader)
        got = [await queue.get(home) for _ in range(3)]
        assert got == items[1:] and queue.qsize() == 0 and queue.grouped == 3
        queue.put(later := group(PREFIX, 1)[0])  # the prefix is warm there now
        assert await queue.get(home) is later and queue.grouped == 4

    asyncio.run(scenario())


def test_an_idle_server_steals_and_a_slow_leader_does_not_stall_its_group() -> None:
    async def scenario() -> None:
        queue, items, _, thief = queued_group(3, leader_wait_s=0.05)
        assert await queue.get(thief) is items[0]  # the only one free: stolen
        assert queue.stolen == 1
        # never answered within leader_wait_s: the group is released anyway
        rest = [await asyncio.wait_for(queue.get(thief), 2) for _ in range(2)]
        assert rest == items[1:]

    asyncio.run(scenario())


def test_prompts_without_a_long_prefix_share_one_line_and_a_restart_cools_keys() -> None:
    async def scenario() -> None:
        queue = AffinityQueue(1024, lambda: ["s0"], leader_wait_s=60)
        plain = [Item(PromptRow(i, prompt=f"q{i}")) for i in range(3)]
        for item in plain:
            queue.put(item)
        assert [await queue.get("s0") for _ in range(3)] == plain
        first = group(PREFIX, 1)[0]
        queue.put(first)
        queue.done(await queue.get("s0"))
        queue.forget("s0")  # restarted: an empty cache
        queue.put(second := group(PREFIX, 1)[0])
        queue.put(third := group(PREFIX, 1)[0])
        assert await queue.get("s0") is second  # a new leader
        assert queue._take("s0") is None  # third waits for it
        queue.done(second)
        assert await queue.get("s0") is third

    asyncio.run(scenario())
