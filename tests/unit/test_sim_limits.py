"""The simulator's prefix reuse and retraction against what real SGLang 0.5.17 did on the H200
(bench/real_sglang/probe_limits.py; data in bench/real_sglang/data/2026-12-01-h200-s6/)."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest

from infra.sglang.flags import ServerFlags
from infra.sglang.memory import plan_memory
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.roofline import build_roofline
from infra.sglang.versions import parse_version
from infra.sim.prefix_cache import PrefixCache, token_bytes
from infra.sim.scheduler import SchedulerOptions, SimScheduler

DATA = Path(__file__).parents[2] / "bench/real_sglang/data/2026-12-01-h200-s6"
TINY = Path(__file__).parents[1] / "fixtures/models/tiny-qwen3-next"


def real_share(file: str, server: str, shape: str) -> float:
    runs = json.loads((DATA / file).read_text())[server]
    return float(next(r["cached_share"] for r in runs if r["shape"] == shape))


def engine(strategy: str, time_scale: float = 1000.0, **flags: Any) -> SimScheduler:
    sf = ServerFlags(mamba_strategy=strategy, mem_fraction_static=0.2,
                     disable_overlap_schedule=strategy == "no_buffer", **flags)
    plan = plan_memory(model_profile(str(TINY), 0.04), gpu_profile("h200"), sf,
                       parse_version("0.5.17"))
    cache = PrefixCache(plan.mamba_strategy, plan.max_total_num_tokens)
    roofline = build_roofline(model_profile(str(TINY), 0.04), gpu_profile("h200"), sf, plan)
    return SimScheduler(plan, roofline, time_scale, lambda _l: None, SchedulerOptions(cache=cache))


def groups(interleave: bool, seed: int) -> list[list[int]]:
    """probe_limits.group_prompts: 48 groups x 4, a 1,536-token prefix + 24 tokens."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 1000) for _ in range(1536)] for _ in range(48)]
    members = [[p + [rng.randrange(3, 1000) for _ in range(24)] for _ in range(4)]
               for p in prefixes]
    if interleave:
        return [members[g][k] for k in range(4) for g in range(48)]
    return [m for group in members for m in group]


async def send(eng: SimScheduler, prompts: list[list[int]], concurrency: int) -> float:
    loop = asyncio.create_task(eng.run())
    sem = asyncio.Semaphore(concurrency)
    cached = total = 0

    async def one(ids: list[int]) -> None:
        nonlocal cached, total
        async with sem:
            req = await eng.submit(len(ids), 8, 8, token_bytes(ids))
            cached += req.cached_tokens
            total += len(ids)

    # Every client task exists before any runs: a client sends its next request the moment
    # an answer frees its slot, within one pass of the event loop. (Created one per
    # `sleep(0)`, on a loaded box the process could lose the CPU between two sends for longer
    # than the simulator's gather window: a group's members then arrived apart and shared
    # 72 % of their prompts where real SGLang shared 2.7 %, one full-suite run of session 12.)
    await asyncio.gather(*(one(ids) for ids in prompts))
    loop.cancel()
    return cached / total


@pytest.mark.parametrize(("strategy", "interleave", "concurrency", "file", "server", "shape"), [
    ("extra_buffer", False, 8, "limits-prefix-try1.results.json", "prefix-eb", "grouped"),
    ("extra_buffer", True, 8, "limits-prefix-try1.results.json", "prefix-eb", "interleaved"),
    ("extra_buffer", False, 1, "limits-prefix-try2.results.json", "prefix-eb", "grouped-c1"),
    ("no_buffer", True, 8, "limits-prefix-try1.results.json", "prefix-nb", "interleaved"),
])
def test_cached_share_matches_real_sglang(strategy: str, interleave: bool, concurrency: int,
                                          file: str, server: str, shape: str) -> None:
    sim = asyncio.run(send(engine(strategy), groups(interleave, 1), concurrency))
    real = real_share(file, server, shape)
    assert abs(sim - real) < 0.08, (sim, real)


def test_no_buffer_reuses_a_whole_cached_prompt_only() -> None:
    cache = PrefixCache("no_buffer", 1_000_000)
    prefix = token_bytes(list(range(1536)))
    cache.insert(prefix + token_bytes([5] * 24))
    assert cache.match(prefix + token_bytes([6] * 24)) == 0  # branches off: nothing
    cache.insert(prefix)  # the bare prefix (real: 98.5 % cached afterwards)
    assert cache.match(prefix + token_bytes([6] * 24)) == 1536
    assert real_share("limits-prefix-try1.results.json", "prefix-nb",
                      "bare-prefix-first") > 0.95


def test_eviction_keeps_the_cache_within_the_pool() -> None:
    cache = PrefixCache("extra_buffer", 4096)
    for g in range(10):
        cache.insert(token_bytes([g] * 1024))
    assert cache.match(token_bytes([0] * 1024)) == 0  # the oldest went
    assert cache.match(token_bytes([9] * 1024)) == 1024


ARRIVAL_GAP_S = 0.0005  # modeled seconds between the probe's clients' first requests


async def closed_loop(eng: SimScheduler, clients: int, requests: int, ignore_eos: bool) -> int:
    loop = asyncio.create_task(eng.run())
    rng = random.Random(clients)
    sem = asyncio.Semaphore(clients)

    async def one(i: int) -> None:
        # The probe's clients reach SGLang over HTTP a little apart, not within one poll
        # (96 over ~50 ms: about 15 decode steps of the tiny model), so SGLang admits the first
        # ones alone and equal-length answers do not all finish in one step; a batch that
        # finishes at once would be refilled at once, in lockstep, and never over-admit.
        while eng._modeled_clock < ARRIVAL_GAP_S * min(i, clients):
            await asyncio.sleep(0)
        async with sem:
            out = 1024 if ignore_eos else max(1, min(1024, int(rng.expovariate(1 / 450))))
            await eng.submit(64, out, 1024)

    await asyncio.gather(*(one(i) for i in range(requests)))
    loop.cancel()
    return eng.stats.retracted_total


@pytest.mark.parametrize(("clients", "ignore_eos"), [(32, False), (96, False), (96, True)])
def test_retractions_per_request_as_real_sglang(clients: int, ignore_eos: bool) -> None:
    """24,576-token pool, 64-token prompts for up to 1,024 new tokens. Real SGLang: none at
    32 clients; 11 per 1,141 answers at 96 (rare: outputs end early, the pool mostly holds);
    138 per 313 at 96 with ignore_eos (every output runs to 1,024: thrashing)."""
    real = {(lv["clients"], lv["ignore_eos"]): lv["retracted"] / lv["completed"]
            for lv in json.loads((DATA / "limits-retract.results.json").read_text())["retract"]}
    # modeled time, one decode step per iteration: admission is tried between steps, as
    # SGLang's scheduler does (and only after a request finished or was retracted)
    eng = engine("extra_buffer", 1e7, max_total_tokens=24576, max_running_requests=256,
                 max_mamba_cache_size=1400)
    eng.max_chunk_steps = 1
    sim = asyncio.run(closed_loop(eng, clients, 4 * clients, ignore_eos)) / (4 * clients)
    want = real[(clients, ignore_eos)]
    if want < 0.05:
        assert sim <= 0.03, (sim, want)
    else:
        assert 0.5 * want <= sim <= 2 * want, (sim, want)


def test_a_retraction_is_logged_as_real_sglang_logs_it() -> None:
    """The simulator's retraction line parses as 0.5.17's does (infra/sglang/observe.py, held
    to the real servers' logs in test_observe.py), with every field real SGLang fills in, and
    the lines sum to the scheduler's own count."""
    from infra.sglang.observe import parse_log

    lines: list[str] = []
    eng = engine("extra_buffer", 1e7, max_total_tokens=24576, max_running_requests=256,
                 max_mamba_cache_size=1400)
    eng.log = lines.append
    eng.max_chunk_steps = 1
    total = asyncio.run(closed_loop(eng, 96, 192, True))
    records = [r for r in parse_log("\n".join(lines)) if r["kind"] == "retract"]
    assert total > 0 and sum(r["retracted_req"] for r in records) == total
    assert all(r["new_tokens_gained"] > 0 and r["mamba_num_gained"] > 0
               and 0 < r["new_token_ratio"] <= 1 for r in records)
