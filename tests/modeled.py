"""A simulated fleet's metrics in modeled time: the tuner's inputs with no wall clock.

Each server is the simulator's own scheduler (`infra.sim.replay.replay_scheduler`) stepping in
modeled time under a closed-loop client; every `tick` modeled seconds it is read into the
`Sample` a scrape of its /metrics gives the monitor (running, queue, pool usage, the
finished and decoded token counters). The tuner's decisions — diagnosis, proposal, canary
verdict — run on these series exactly as on a live fleet's, deterministically and in
milliseconds to seconds, where a scenario on real processes at a high time scale took
minutes of a 2-core box and read differently under load (#25).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

from infra.sglang.flags import ServerFlags
from infra.sglang.hardware import Hardware
from infra.sim.replay import replay_scheduler
from infra.sim.scheduler import SimScheduler
from tasks.monitor import Sample
from tasks.tuning.judge import Verdict, judge


@dataclass(frozen=True)
class ModeledServer:
    """One server of the modeled fleet: its flags, how long it ran before the first sample
    (0: it starts at t=0, as a restarted canary does), and the requests its client keeps
    out (None: its cap plus a queue of 4, the pipeline's default)."""

    name: str
    flags: ServerFlags
    warm_s: float = 0.0
    in_flight: int | None = None


def scheduler_for(hw: Hardware, flags: ServerFlags) -> SimScheduler:
    return replay_scheduler(hw.model, hw.gpu, flags, hw.version)


async def _sampled(hw: Hardware, server: ModeledServer, prompt_tokens: int,
                   lengths: Iterator[int], until: float, tick: float) -> list[Sample]:
    engine = scheduler_for(hw, server.flags)
    in_flight = server.in_flight or engine.plan.max_running_requests + 4

    async def client() -> None:
        while True:
            await engine.submit(prompt_tokens, next(lengths))

    tasks = [asyncio.create_task(engine.run())]
    tasks += [asyncio.create_task(client()) for _ in range(in_flight)]
    rows: list[Sample] = []
    t = 0.0
    try:
        while t <= until:
            while engine._modeled_clock < t + server.warm_s:
                await asyncio.sleep(0)
            rows.append(_read(engine, server.name, t))
            t += tick
    finally:
        for task in tasks:
            task.cancel()
    return rows


def _read(engine: SimScheduler, name: str, t: float) -> Sample:
    st = engine.stats
    return Sample(t, 1, name, True, st.running, st.queued, engine.kv_usage(),
                  engine.mamba_usage(), st.gen_throughput, float(st.generation_tokens_total),
                  float(st.retracted_last), st.cache_hit_rate, float(st.requests_total),
                  float(st.decode_tokens_total))


def sampled_server(hw: Hardware, server: ModeledServer, prompt_tokens: int,
                   lengths: list[int], until: float, tick: float = 0.5) -> list[Sample]:
    """One server's scrapes every `tick` modeled seconds over [0, until]; its client sends
    `lengths` in turn (cycling), each with `prompt_tokens` of prompt."""
    def cycle() -> Iterator[int]:
        while True:
            yield from lengths

    return asyncio.run(_sampled(hw, server, prompt_tokens, cycle(), until, tick))


def sampled_fleet(hw: Hardware, servers: list[ModeledServer], prompt_tokens: int,
                  lengths: list[int], until: float, tick: float = 0.5) -> list[Sample]:
    """Every server's scrapes, in the monitor's order (by time, then server)."""
    rows = [s for server in servers
            for s in sampled_server(hw, server, prompt_tokens, lengths, until, tick)]
    return sorted(rows, key=lambda s: (s.t, s.server))


def first_verdict(rows: list[Sample], window: float, start: float, until: float,
                  canary: set[str], bar: float) -> Verdict | None:
    """The judge's first verdict other than "wait", looking every `window` from `start` as a
    canary cycle does (tasks/tuning/canary.py), on what was scraped by then."""
    t, verdict = start, None
    while t <= until:
        verdict = judge([s for s in rows if s.t <= t], window, t, canary, 1.0, bar,
                        final=False)
        if verdict.decision != "wait":
            break
        t += window
    return verdict
