"""Run a fixed workload through the simulator's scheduler in modeled time, with no HTTP.

What the simulated server would do for `requests` requests of fixed prompt and output length,
sent by a client that keeps `in_flight` outstanding (the pipeline keeps the cap plus its
queue target). Used to hold the simulator to real end-to-end runs (tests/unit/
test_real_sglang_e2e.py) and to sweep configurations without waiting on wall clocks.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from infra.sglang.flags import ServerFlags
from infra.sglang.memory import plan_memory
from infra.sglang.profiles import GpuProfile, ModelProfile
from infra.sglang.roofline import build_roofline
from infra.sglang.versions import SGLangVersion
from infra.sim.engine import SimEngine

# Fast enough that a replay of thousands of requests takes a fraction of a second.
REPLAY_TIME_SCALE = 1e7


@dataclass(frozen=True)
class ReplayResult:
    cap: int
    tok_s: float  # output tokens per modeled second, first request sent to last finished
    busy_tok_s: float  # from the first completion to the last send: a full queue throughout
    seconds: float


async def _replay(engine: SimEngine, requests: int, in_flight: int, prompt_tokens: int,
                  output_tokens: int) -> tuple[float, float, float]:
    loop = asyncio.create_task(engine.run())
    sem = asyncio.Semaphore(in_flight)
    marks: dict[int, tuple[float, int]] = {}  # send index → (modeled clock, tokens done)

    async def one(i: int) -> None:
        async with sem:
            marks[i] = (engine._modeled_clock, engine.stats.generation_tokens_total)
            await engine.submit(prompt_tokens, output_tokens)

    try:
        await asyncio.gather(*(one(i) for i in range(requests)))
    finally:
        loop.cancel()
    (t0, n0), (t1, n1) = marks[min(in_flight, requests - 1)], marks[requests - 1]
    return engine._modeled_clock, t1 - t0, n1 - n0


def replay(model: ModelProfile, gpu: GpuProfile, flags: ServerFlags, version: SGLangVersion,
           requests: int, prompt_tokens: int, output_tokens: int,
           queue_target: int = 4) -> ReplayResult:
    """The simulator's figures for this workload under these flags."""
    plan = plan_memory(model, gpu, flags, version)
    roofline = build_roofline(model, gpu, flags, plan)
    prefix_state = version.locks_prefix_state and not flags.disable_radix_cache
    engine = SimEngine(plan, roofline, REPLAY_TIME_SCALE, lambda _line: None,
                       prefix_state=prefix_state, max_chunk_steps=1)
    total_s, busy_s, busy_tokens = asyncio.run(_replay(
        engine, requests, plan.max_running_requests + queue_target, prompt_tokens,
        output_tokens))
    tokens = requests * output_tokens
    return ReplayResult(cap=plan.max_running_requests, tok_s=tokens / total_s,
                        busy_tok_s=busy_tokens / busy_s if busy_s > 0 else 0.0,
                        seconds=total_s)


@dataclass(frozen=True)
class ClosedLoopResult:
    """What a closed loop over a request list got from the simulated server."""

    cap: int
    max_total_num_tokens: int
    answered: int
    committed_tokens: int  # output tokens of the answered requests
    seconds: float  # modeled: the first send to the last answer (or the deadline)
    retracted: int

    @property
    def committed_tok_s(self) -> float:
        return self.committed_tokens / self.seconds if self.seconds > 0 else 0.0


async def _closed_loop(engine: SimEngine, reqs: list[tuple[int, int]], concurrency: int,
                       max_s: float) -> tuple[int, int, float]:
    loop = asyncio.create_task(engine.run())
    pending = list(reversed(reqs))
    answered = tokens = 0
    last = 0.0

    async def worker() -> None:
        nonlocal answered, tokens, last
        while pending and engine._modeled_clock < max_s:
            prompt, out = pending.pop()
            await engine.submit(prompt, out)
            if engine._modeled_clock <= max_s:
                answered += 1
                tokens += out
                last = engine._modeled_clock

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        loop.cancel()
    seconds = last if not pending and last < max_s else max_s
    return answered, tokens, seconds


def replay_requests(model: ModelProfile, gpu: GpuProfile, flags: ServerFlags,
                    version: SGLangVersion, reqs: list[tuple[int, int]], concurrency: int,
                    max_s: float = float("inf")) -> ClosedLoopResult:
    """A closed loop of `concurrency` clients over (prompt tokens, output tokens) rows, as
    bench/real_sglang/probe_long.py drives real SGLang: every row's output runs to its
    length (ignore_eos), a row answered after `max_s` modeled seconds does not count."""
    plan = plan_memory(model, gpu, flags, version)
    roofline = build_roofline(model, gpu, flags, plan)
    prefix_state = version.locks_prefix_state and not flags.disable_radix_cache
    engine = SimEngine(plan, roofline, REPLAY_TIME_SCALE, lambda _line: None,
                       prefix_state=prefix_state, max_chunk_steps=1)
    answered, tokens, seconds = asyncio.run(_closed_loop(engine, reqs, concurrency, max_s))
    return ClosedLoopResult(cap=plan.max_running_requests,
                            max_total_num_tokens=plan.max_total_num_tokens, answered=answered,
                            committed_tokens=tokens, seconds=seconds,
                            retracted=engine.stats.retracted_total)
