"""The prefix cache lives in the KV pool's free part: the simulator against what prefix affinity
did through the pipeline on three real SGLang 0.5.17 servers (H200, tiny Qwen3-Next;
bench/real_sglang/data/2026-12-01-h200-s7/affinity-runs.json).

One server's share of that run is replayed on the engine in affinity order (a group's first
prompt alone, the rest to the front of the line once it is answered): with 12 clients the
cache keeps the documents (real: 59.0 % of prompt tokens reused), with the cap's 124 the
running requests fill the pool and the documents are evicted before their followers come
(real: 42.7 %, and no better than without affinity).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import deque
from pathlib import Path

import pytest

from infra.sim.prefix_cache import PrefixCache, token_bytes
from infra.sim.scheduler import SimScheduler
from tests.unit.test_sim_limits import engine

DATA = Path(__file__).parents[2] / "bench/real_sglang/data/2026-12-01-h200-s7"
DOC_TOKENS, OWN_TOKENS = 3552, 20  # the real prompts: 3,572 tokens, the document's ~3,550


def real_on_share(name: str) -> float:
    runs = json.loads((DATA / "affinity-runs.json").read_text())["runs"]
    return float(next(r["on"]["cached_share"] for r in runs if r["name"] == name))


def group_prompts(groups: int, seed: int) -> list[list[list[int]]]:
    rng = random.Random(seed)
    out = []
    for _ in range(groups):
        doc = [rng.randrange(3, 50_000) for _ in range(DOC_TOKENS)]
        out.append([doc + [rng.randrange(3, 50_000) for _ in range(OWN_TOKENS)]
                    for _ in range(4)])
    return out


async def affinity_order(eng: SimScheduler, groups: list[list[list[int]]], clients: int) -> float:
    """`clients` workers; a leader's answer puts its followers at the front of the line."""
    loop = asyncio.create_task(eng.run())
    line: deque[tuple[list[int], list[list[int]]]] = deque((g[0], g[1:]) for g in groups)
    cached = total = 0

    async def worker() -> None:
        nonlocal cached, total
        while line:
            ids, followers = line.popleft()
            req = await eng.submit(len(ids), 16, 16, token_bytes(ids))
            cached, total = cached + req.cached_tokens, total + len(ids)
            line.extendleft((f, []) for f in reversed(followers))

    await asyncio.gather(*(worker() for _ in range(clients)))
    loop.cancel()
    return cached / total


@pytest.mark.parametrize(("clients", "run", "within"), [
    # real fell 15 points short of the 74 % maximum with 12 clients, for a reason the
    # simulator does not have (documented in docs/TUNING.md); it must not fall further
    (12, "clients-12", 0.16),
    (124, "default", 0.08),
])
def test_reuse_needs_room_beside_the_running_requests(clients: int, run: str,
                                                      within: float) -> None:
    eng = engine("extra_buffer", max_total_tokens=400_000, max_mamba_cache_size=600)
    assert eng.plan.max_running_requests == 120
    sim = asyncio.run(affinity_order(eng, group_prompts(133, 7), clients))
    real = real_on_share(run)
    assert abs(sim - real) < within, (sim, real)


def test_a_full_pool_costs_the_reuse_affinity_set_up() -> None:
    """The point of the measurement: the same order reuses far less at the cap."""
    shares = [asyncio.run(affinity_order(
        engine("extra_buffer", max_total_tokens=400_000, max_mamba_cache_size=600),
        group_prompts(133, 7), clients)) for clients in (12, 124)]
    assert shares[0] - shares[1] > 0.15, shares
    assert real_on_share("clients-12") - real_on_share("default") > 0.15


def test_eviction_goes_down_to_the_room_it_is_given() -> None:
    cache = PrefixCache("extra_buffer", 1_000_000)
    for g in range(4):
        cache.insert(token_bytes([g] * 1024))
    cache.insert(token_bytes([9] * 1024), room=2048)  # running requests hold the rest
    assert cache.match(token_bytes([1] * 1024)) == 0
    assert cache.match(token_bytes([3] * 1024)) == 1024
    assert cache.match(token_bytes([9] * 1024)) == 1024
