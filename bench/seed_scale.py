"""The seeds' whole job in modeled time: how much of the fleet's GPU time becomes output (#29).

    python bench/seed_scale.py                   (902,087 prompts, seven B200s: the seeds')
    python bench/seed_scale.py --prompts 20000   (a slice)

seed-004 ran 902,087 prompts for 41 hours on seven B200s: Qwen3.6-27B with MTP, extra_buffer,
`--max-mamba-cache-size 80`, 64 requests a server from the client, a cap that read 16. Here
that job runs on a modeled fleet (bench/fleet_model.py: the simulator's scheduler per server,
the dispatcher's one queue, a virtual clock): servers that take the seeds' four minutes to
start, answers of a reasoning model (lognormal, mean 2,000 and p99 16,000 tokens), and the
tuner's own decisions on the fleet's scrapes — diagnosis, proposal (committed-rate demand),
the payback rule, a canary judged against the others (tasks/tuning/judge.py), a rollout one
server at a time or a rollback, a client-only move — with the pipeline's default settings.

One JSON line: `prompts`, `exactly_once` (every prompt committed once; cut-short requests
redone), `job_efficiency` = output tokens ÷ (Σ over servers of the best steady rate × wall
time), the best rate (the policy's levers swept with the committed-rate replay,
bench/long_mixed.py) and `lost_gpu_time` in GPU-hours split into start-up (first launch),
tuning (restarts and drains, and running a configuration slower than the best), tail (the
queue empty, servers finishing their last answers), idle (a server up with nothing to run
while work waits) and retries (tokens of requests a restart cut short).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleet_model import ModeledFleet, run_modeled, steady_tok_s  # noqa: E402
from long_mixed import committed_sweep, workload  # noqa: E402

from infra.settings import TuningSettings  # noqa: E402
from infra.sglang.flags import ServerFlags  # noqa: E402
from infra.sglang.hardware import Hardware  # noqa: E402
from infra.sglang.memory import plan_memory  # noqa: E402
from infra.sglang.planner import Demand  # noqa: E402
from infra.sglang.profiles import gpu_profile, model_profile  # noqa: E402
from infra.sglang.versions import parse_version  # noqa: E402
from tasks.monitor import Sample  # noqa: E402
from tasks.tuning.canary import MAX_JUDGE_WINDOWS, MIN_JUDGE_WINDOWS  # noqa: E402
from tasks.tuning.diagnosis import diagnose, window_stats  # noqa: E402
from tasks.tuning.judge import judge  # noqa: E402
from tasks.tuning.ledger import config_key  # noqa: E402
from tasks.tuning.policy import Proposal, Search, propose  # noqa: E402

SEEDS: dict[str, Any] = {  # seed-004 (../shared/seeds/004_*.txt)
    "model": "Qwen/Qwen3.6-27B", "gpu": "b200", "version": "main", "prompts": 902_087,
    "servers": 7, "startup_s": 240.0, "clients": 64, "output_mean": 2000, "output_p99": 16000,
    "max_new_tokens": 32768, "prompt_bytes": 1500,  # the seeds give no prompt length
    "server": {"mamba_strategy": "extra_buffer", "max_mamba_cache_size": 80,
               "speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
               "speculative_eagle_topk": 1},
}
TICK_S = 5.0  # the monitor's sample interval (tuning.sample_interval_s)
KEEP_S = 1800.0  # scrapes kept for the tuner: a canary is judged within 20 windows
STEADY_ROWS = 15000  # a best rate's run: ~1.5 modeled hours of one server


@dataclass
class Ledger:
    """GPU-seconds lost, by cause, and the tuner's cycles."""

    lost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("startup", "tuning_restarts", "tuning_below_best", "tail", "idle"), 0.0))
    cycles: list[dict[str, Any]] = field(default_factory=list)


class Job:
    def __init__(self, sc: dict[str, Any], best_tok_s: float, seed: int) -> None:
        self.sc = sc
        self.hw = Hardware(model_profile(sc["model"]), gpu_profile(sc["gpu"]),
                           parse_version(sc["version"]))
        self.work = workload(sc)
        lengths = self.work.output_lengths(sc["prompts"], seed)
        self.fleet = ModeledFleet(self.hw, lengths, self.work.prompt_tokens,
                                  sc["max_new_tokens"], sc["startup_s"], sc["clients"])
        self.best = best_tok_s
        self.tuning = TuningSettings()
        self.samples: list[Sample] = []
        self.ledger = Ledger()
        self.current = ServerFlags(**sc["server"])
        self.names = [f"server-{i}" for i in range(sc["servers"])]
        self.epoch = 1
        self._last_tick = 0.0
        self._decoded: dict[str, float] = {}

    async def run(self) -> float:
        for name in self.names:
            self.fleet.launch(name, self.current)
        watch = asyncio.create_task(self._monitor())
        tuner = asyncio.create_task(self._tuner())
        await self.fleet.finished.wait()
        end = self.fleet.now()
        for task in (watch, tuner):
            task.cancel()
        self._account(end - self._last_tick, end)
        return end

    # --- what the monitor sees, and where GPU time went -----------------------------------

    async def _monitor(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            t = self.fleet.now()
            self._account(TICK_S, t)
            self._last_tick = t
            self.samples += self.fleet.sample(t, self.epoch)
            if self.samples and self.samples[0].t < t - KEEP_S:
                self.samples = [s for s in self.samples if s.t >= t - KEEP_S]

    def _account(self, dt: float, t: float) -> None:
        for name in self.names:
            server = self.fleet.servers[name]
            decoded = self.fleet.decoded(name)
            produced = decoded - self._decoded.get(name, 0.0)
            self._decoded[name] = decoded
            lost = dt - produced / self.best
            if server.engine is None or not server.accepting:
                cause = "tuning_restarts" if server.launches else "startup"
            elif not self.fleet.queue:
                cause = "tail"
            elif not server.engine.running:
                cause = "idle"
            else:
                cause = "tuning_below_best"
            self.ledger.lost[cause] += lost

    # --- the tuner: the flow's decisions on the fleet's scrapes ----------------------------

    async def _tuner(self) -> None:
        window = self.tuning.window_s
        tried = {config_key(self.current, self.fleet.clients)}
        await self._all_up()
        budget = self.tuning.max_restarts
        while budget > 0:
            await asyncio.sleep(window)
            proposal = self._propose(window, tried)
            if proposal is None:
                continue
            tried.add(config_key(proposal.flags, proposal.concurrency))
            if proposal.flags == self.current:  # a client-only move: no restart
                self.fleet.set_clients(proposal.concurrency)
                self._record(proposal, "client_only", None)
                continue
            budget -= 1
            await self._canary(proposal, window)

    async def _all_up(self) -> None:
        while any(self.fleet.servers[n].engine is None for n in self.names):
            await asyncio.sleep(TICK_S)

    def _propose(self, window: float, tried: set[str]) -> Proposal | None:
        t = self.fleet.now()
        rows = [s for s in self.samples if s.t >= t - 2 * window]
        plan = plan_memory(self.hw.model, self.hw.gpu, self.current, self.hw.version)
        caps = {n: plan.max_running_requests for n in self.names}
        diag = diagnose(window_stats(rows, t - 2 * window, 1.0), caps, plan)
        proposal = propose(diag, self.current, self.fleet.clients,
                           Search(self.hw, frozenset(tried), Demand(workload=self.work),
                                  min_gain=self.tuning.min_predicted_gain))
        if proposal is None or proposal.predicted_gain is None:
            return proposal
        left_s = self._work_left_s(diag.tok_s_per_gpu)
        pays = left_s * (1 - 1 / proposal.predicted_gain) >= (
            self.tuning.restart_payback * self.sc["startup_s"])
        return proposal if pays else None

    def _work_left_s(self, tok_s_per_gpu: float) -> float:
        left = sum(self.fleet.lengths[i] for i in self.fleet.queue)
        return left / max(1e-9, tok_s_per_gpu * len(self.names))

    async def _canary(self, proposal: Proposal, window: float) -> None:
        canary, old, old_clients = self.names[0], self.current, self.fleet.clients
        # the candidate carries its client concurrency (tasks/tuning/rollout.py: None, the cap + 4)
        await self._restart(canary, proposal.flags, proposal.concurrency)
        since = self.fleet.now()
        verdict = None
        while True:
            await asyncio.sleep(window)
            t = self.fleet.now()
            if t - since < MIN_JUDGE_WINDOWS * window:
                continue
            verdict = judge(self.samples, since, t, {canary}, 1.0,
                            self.tuning.canary_min_gain,
                            final=t - since >= MAX_JUDGE_WINDOWS * window)
            if verdict.decision != "wait":
                break
        if verdict.decision == "better":
            self.current = proposal.flags
            self.epoch += 1
            self.fleet.clients = proposal.concurrency
            for name in self.names[1:]:
                await self._restart(name, proposal.flags, proposal.concurrency)
            self._record(proposal, "rolled_out", verdict.gain)
        else:
            await self._restart(canary, old, old_clients)
            self._record(proposal, "rolled_back", verdict.gain)

    async def _restart(self, name: str, flags: ServerFlags, clients: int | None) -> None:
        await self.fleet.stop(name, self.tuning.drain_timeout_s)
        await self.fleet.launch(name, flags, clients=clients)

    def _record(self, proposal: Proposal, outcome: str, measured: float | None) -> None:
        self.ledger.cycles.append({
            "at_h": round(self.fleet.now() / 3600, 3), "outcome": outcome,
            "flags": proposal.flags.model_dump(exclude_none=True, exclude={"extra_args"}),
            "concurrency": proposal.concurrency,
            "predicted_gain": round(proposal.predicted_gain, 3)
            if proposal.predicted_gain else None,
            "measured_gain": round(measured, 3) if measured else None})


def best_rate(sc: dict[str, Any], seed: int) -> tuple[float, dict[str, Any]]:
    """The best steady rate per server the policy's levers reach: the sweep over them (the
    start's MTP kept, its slot limit lifted) ranks configurations by the predictor's replay;
    the winner's rate is then read the way the job runs it, one server on the modeled fleet
    over hours of the job's own lengths (STEADY_ROWS of them) — the yardstick is the model
    the job runs on, not the predictor's estimate of it."""
    free = {k: v for k, v in sc["server"].items() if k != "max_mamba_cache_size"}
    _, flags = committed_sweep(sc | {"server": free})
    return rate_of(sc, flags, seed), flags


def rate_of(sc: dict[str, Any], flags: dict[str, Any], seed: int) -> float:
    work = workload(sc)
    hw = Hardware(model_profile(sc["model"]), gpu_profile(sc["gpu"]),
                  parse_version(sc["version"]))
    return steady_tok_s(hw, ServerFlags(**flags), work.output_lengths(STEADY_ROWS, seed),
                        work.prompt_tokens, sc["max_new_tokens"], clients=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--prompts", type=int, default=SEEDS["prompts"])
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    sc = SEEDS | {"prompts": args.prompts}
    t0 = time.monotonic()
    best, best_flags = best_rate(sc, args.seed)
    print(f"best steady rate {best:.1f} tok/s a server ({time.monotonic() - t0:.0f} s)",
          file=sys.stderr)
    job = Job(sc, best, args.seed)
    wall = run_modeled(job.run())
    tally = job.fleet.tally
    tokens = tally.committed_tokens
    gpu_s = wall * len(job.names)
    lost = {k: round(v / 3600, 2) for k, v in job.ledger.lost.items()}
    lost["retries"] = round(tally.discarded_tokens / best / 3600, 2)
    print(json.dumps({
        "prompts": sc["prompts"],
        "exactly_once": set(job.fleet.answers) == {1} and tally.done == sc["prompts"],
        "output_tokens": tokens, "wall_h": round(wall / 3600, 2),
        "job_efficiency": round(tokens / (best * gpu_s), 4),
        "best_tok_s_per_server": round(best, 1), "best_flags": best_flags,
        "start_tok_s_per_server": round(rate_of(sc, sc["server"], args.seed), 1),
        "lost_gpu_time_h": lost, "gpu_h": round(gpu_s / 3600, 2),
        "cycles": job.ledger.cycles, "server_restarts": tally.restarts,
        "bench_s": round(time.monotonic() - t0, 1)}))


if __name__ == "__main__":
    main()
