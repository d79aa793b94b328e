"""Predict what a job gets: committed output tokens per second of one server at its cap.

The roofline's decode rate (`planner.predict_tok_s`) counts decode steps only. A job commits
less: every request is prefilled first (on the H200 a 27B prefills ~11k tok/s, so 1,024
prompt tokens cost as much GPU time as ~80 decode steps of a full batch), fixed lengths run
in waves, and long outputs fill the KV pool until SGLang retracts and re-prefills. Rather
than a second formula for all of that, the prediction *is* the simulator: the same scheduler
that serves the simulated fleet, replayed in modeled time (`replay.replay_requests`) over a
workload's rows, with the pipeline's client concurrency (the cap plus its queue target), and
read over the steady part of the run (from the end of the first round to the last send).

Held to real SGLang 0.5.17 on the H200 (tests/unit/test_predict_committed.py): the
Qwen3.6-27B shapes at four configurations within 7 % at 1,024 + 256 tokens, long mixed
outputs within 5 %, NemotronH-4B 10–11 % at caps 115 and 237 (bench/real_sglang/data/).

A replay is seconds of pure Python for long outputs at a high cap, so it runs in a worker
process of its own (`replay_worker.py`: in the generating process it stalled the dispatcher).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from statistics import NormalDist

from infra.sglang.flags import ServerFlags
from infra.sglang.memory import plan_memory
from infra.sglang.profiles import GpuProfile, ModelProfile
from infra.sglang.versions import SGLangVersion
from infra.sim.replay import ClosedLoopResult
from infra.sim.replay_worker import WORKER
from infra.sim.text import lognormal_params

ROUNDS_FIXED = 4  # rounds of the cap replayed for fixed lengths (waves: the 2nd is steady)
# For a spread of lengths: the running set's steady composition is length-biased (a long
# request stays for many rounds), and at 8 rounds it had not filled with long requests yet —
# on the seeds' B200 job the replay read 6,254 tok/s for a KV-bound cap of 98 that runs
# ~5,500 over hours (bench/fleet_model.py) and 5,372 for a cap of 69 that runs ~6,000: it
# ranked them the wrong way round. At 32: 5,678 and 5,826, and the real long-output restart
# cycle (tests/unit/test_real_long_restart.py) within +4.4 % and −2.1 %. Costs ~3× the time.
ROUNDS_MIXED = 32


@dataclass(frozen=True)
class Workload:
    """What the job asks of each server: prompt length, and output lengths by mean and p99."""

    prompt_tokens: int
    output_tokens: int  # mean
    output_p99: int | None = None  # None: every output is `output_tokens` long

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError("workload: prompt and output tokens must be at least 1")
        if self.output_p99 is not None and self.output_p99 <= self.output_tokens:
            raise ValueError(f"workload: output p99 ({self.output_p99}) must exceed the mean "
                             f"({self.output_tokens}); leave it out for fixed lengths")

    def kv_per_request(self) -> int:
        """KV tokens a running request holds, to size a cap its pool can carry: prompt +
        output for alike answers (as before); with a tail, the running set is the long
        answers — a request seen running is one of them in proportion to its length, half
        way through on average: E[L²] / 2E[L] = mean × exp(σ²) / 2 (a lognormal's). Mean
        2,000, p99 16,000: 4,300 tokens of output where the mean said 2,000."""
        output = float(self.output_tokens)
        if self.output_p99 is not None and self.output_p99 > self.output_tokens:
            _, sigma = lognormal_params(self.output_tokens, self.output_p99)
            output = max(output, self.output_tokens * math.exp(sigma * sigma) / 2.0)
        return self.prompt_tokens + round(output)

    def output_lengths(self, n: int, seed: int = 0) -> list[int]:
        """n output lengths: fixed, or lognormal with this mean and p99 taken at evenly
        spaced quantiles (no sampling noise between two predictions), in a seeded order."""
        if self.output_p99 is None:
            return [self.output_tokens] * n
        normal = NormalDist(*lognormal_params(self.output_tokens, self.output_p99))
        lengths = [max(1, round(math.exp(normal.inv_cdf((i + 0.5) / n)))) for i in range(n)]
        random.Random(seed).shuffle(lengths)
        return lengths


def committed_tok_s(model: ModelProfile, gpu: GpuProfile, flags: ServerFlags,
                    version: SGLangVersion, workload: Workload, queue_target: int = 4) -> float:
    """Steady committed output tok/s of one server (per GPU: divide by its TP size)."""
    key = (model, gpu, flags, version, workload, queue_target)
    if key not in _RATES:
        prefetch(model, gpu, [flags], version, workload, queue_target)
    return _RATES[key]


def prefetch(model: ModelProfile, gpu: GpuProfile, flag_sets: list[ServerFlags],
             version: SGLangVersion, workload: Workload, queue_target: int = 4) -> None:
    """Replay every configuration not yet known, in one trip to the worker: the tuner
    scores a few hundred candidates, and a round trip each would cost more than their
    replays at the mean."""
    todo = list(dict.fromkeys(f for f in flag_sets if (model, gpu, f, version, workload,
                                                         queue_target) not in _RATES))
    if not todo:
        return
    if len(_RATES) + len(todo) > MAX_KEPT:
        _RATES.clear()
    jobs = [_replay_args(model, gpu, f, version, workload, queue_target) for f in todo]
    results: list[ClosedLoopResult] = WORKER.replay_many(jobs)
    for flags, result in zip(todo, results, strict=True):
        _RATES[(model, gpu, flags, version, workload, queue_target)] = (
            result.steady_tok_s or result.committed_tok_s)


MAX_KEPT = 4096  # rates remembered (a tuner asks for the same ones each cycle)
_RATES: dict[tuple[ModelProfile, GpuProfile, ServerFlags, SGLangVersion, Workload, int],
             float] = {}


def _replay_args(model: ModelProfile, gpu: GpuProfile, flags: ServerFlags,
                 version: SGLangVersion, workload: Workload,
                 queue_target: int) -> tuple[object, ...]:
    """`replay.replay_requests`'s arguments: the cap's clients over enough rounds of what
    runs at once — the cap, or as many of the workload's requests as the KV pool holds where
    that is fewer (LFM2-8B-A1B's cap of 4,096 runs ~760 long answers: rounds of the cap's
    clients were 131 k rows a replay, 12 s a plan, for the same rate as 24 k)."""
    plan = plan_memory(model, gpu, flags, version)
    clients = plan.max_running_requests + queue_target
    running = min(plan.max_running_requests, plan.kv_holds(workload.kv_per_request()))
    rounds = ROUNDS_FIXED if workload.output_p99 is None else ROUNDS_MIXED
    count = rounds * (running + queue_target)
    rows = [(workload.prompt_tokens, out) for out in workload.output_lengths(count)]
    return (model, gpu, flags, version, rows, clients)
