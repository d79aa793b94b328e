"""Prefix primers: on a server that cannot resume where prompts branch off a cached one
(no_buffer), a group's shared prefix goes first as a one-token request (tasks/affinity.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from infra.prompt_row import PromptRow
from tasks.affinity import (
    MIN_PRIMER_CHARS,
    AffinityQueue,
    Primer,
    owner,
    prefix_key,
    shared_prefix_row,
)
from tests.unit.test_affinity import PREFIX, Item, group


def text(prompt: str) -> PromptRow:
    return PromptRow(1, prompt=prompt)


def tokens(ids: list[int]) -> PromptRow:
    return PromptRow(1, input_ids=ids)


def test_text_is_cut_before_a_space_that_follows_a_word() -> None:
    a = text(PREFIX + "Question one: why?")
    b = text(PREFIX + "Question two: why?")
    row = shared_prefix_row(a, b)
    assert row == PromptRow(None, prompt=PREFIX + "Question")  # not "Question " nor "t"
    assert row.prompt and a.prompt and b.prompt
    assert a.prompt.startswith(row.prompt) and b.prompt.startswith(row.prompt)


def test_a_cut_never_falls_after_punctuation_or_inside_a_word() -> None:
    doc = "word " * 100
    # ".\n\n" is one pre-token: a primer ending in "end." would not be a prefix of the tokens
    row = shared_prefix_row(text(doc + "end.\n\nQ1"), text(doc + "end.\n\nQ2"))
    assert row == PromptRow(None, prompt=doc.rstrip())
    assert shared_prefix_row(text(doc + "alpha"), text(doc + "alps")) == PromptRow(
        None, prompt=doc.rstrip())


def test_token_ids_are_cut_exactly_and_chat_rows_are_not_primed() -> None:
    ids = list(range(300))
    assert shared_prefix_row(tokens([*ids, 1]), tokens([*ids, 2])) == PromptRow(
        None, input_ids=ids)
    assert shared_prefix_row(tokens([1, 2, 3]), tokens([1, 2, 4])) is None
    chat = PromptRow(1, messages=[{"role": "user", "content": PREFIX}])
    assert shared_prefix_row(chat, chat) is None
    short = "x " * (MIN_PRIMER_CHARS // 4)
    assert shared_prefix_row(text(short + "a b"), text(short + "c d")) is None


def primed_queue(primes: bool) -> tuple[AffinityQueue, list[Item], str]:
    queue = AffinityQueue(1024, lambda: ["s0", "s1"], leader_wait_s=60,
                          primes=lambda server: primes)
    items = group(PREFIX, 4)
    for item in items:
        queue.put(item)
    return queue, items, owner(prefix_key(items[0].row, 1024) or "", ["s0", "s1"])


def test_the_primer_leads_and_the_whole_group_follows_it() -> None:
    async def scenario() -> None:
        queue, items, home = primed_queue(primes=True)
        primer = await queue.get(home)
        assert isinstance(primer, Primer) and queue.primed == 1
        assert primer.row == PromptRow(None, prompt=PREFIX + "Question")
        assert queue.qsize() == 4  # every prompt still waits: the leader too
        assert await asyncio.wait_for(_nothing_for(queue, home), 1) is None
        queue.done(primer)
        got: list[Any] = [await queue.get(home) for _ in range(4)]
        assert got == items and queue.qsize() == 0

    asyncio.run(scenario())


def test_a_server_that_branches_gets_no_primer() -> None:
    async def scenario() -> None:
        queue, items, home = primed_queue(primes=False)
        assert await queue.get(home) is items[0] and queue.primed == 0

    asyncio.run(scenario())


async def _nothing_for(queue: AffinityQueue, server: str) -> Any:
    """What `server` gets within 0.3 s (None: nothing; the group waits for its primer)."""
    try:
        return await asyncio.wait_for(queue.get(server), 0.3)
    except TimeoutError:
        return None


def test_no_buffer_servers_are_the_ones_that_get_primers() -> None:
    from infra.settings import load_settings
    from tasks.capacity import Capacity
    from tasks.dispatch import Endpoint
    from tasks.fleet_config import FleetConfig
    from tasks.shards import endpoint_of

    def endpoint(**flags: object) -> Endpoint:
        settings = load_settings(None, **flags)
        return endpoint_of(FleetConfig.of(settings), settings.client.queue_target, cap)

    cap = Capacity(0, "http://h:1", "0.5.17", 32, 100_000, 160, 4096, "cfg")
    assert endpoint(**{"server.mamba_strategy": "no_buffer"}).primes_prefixes
    assert not endpoint(**{"server.mamba_strategy": "extra_buffer"}).primes_prefixes
    assert not endpoint(**{"server.mamba_strategy": "no_buffer",
                           "server.disable_radix_cache": True}).primes_prefixes
