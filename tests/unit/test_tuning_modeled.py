"""The seeds' seed-004 decision, made in modeled time: diagnosis, move, canary verdict.

seed-004 ran the Qwen3.6-27B shapes on B200s with extra_buffer, `--max-mamba-cache-size 80`
and MTP (EAGLE, 3 steps), its client at 64 per server: the cap read 16 and the GPUs idled.
Here two simulated servers run that start under the seeds' client; the watch's diagnosis
reads their metrics, the policy chooses a move, the move runs as a fresh canary beside a
control that kept the start, and the judge reads both — the chain the flow runs on a live
fleet (tasks/tuning), on the simulator's scheduler in modeled time (tests/modeled.py). The
whole loop on real processes is tests/e2e/test_tuning.py's seed-000 scenario.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import cache

from infra.settings import JobSettings, load_settings
from infra.sglang.flags import ServerFlags
from infra.sglang.hardware import Hardware
from infra.sglang.memory import plan_memory
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.versions import parse_version
from infra.sim.predict import Workload
from tasks.capacity import Capacity
from tasks.feed import FeedSample
from tasks.fleet_config import FleetConfig
from tasks.monitor import Sample
from tasks.rolling import Replaced
from tasks.tuning.canary import CanaryRun
from tasks.tuning.diagnosis import Diagnosis, diagnose, window_stats
from tasks.tuning.ledger import config_key
from tasks.tuning.policy import Proposal, Search, propose
from tests.modeled import ModeledServer, first_verdict, sampled_fleet

HW = Hardware(model_profile("Qwen/Qwen3.6-27B"), gpu_profile("b200"), parse_version("main"))
START = ServerFlags(mamba_strategy="extra_buffer", max_mamba_cache_size=80,
                    speculative_algorithm="EAGLE", speculative_num_steps=3,
                    speculative_eagle_topk=1)
CLIENT = 64  # the seeds' client concurrency per server
PROMPT = 64
LENGTHS = [min(2048, n) for n in Workload(PROMPT, 1000, 4000).output_lengths(4000)]
WINDOW = 20.0  # modeled seconds
BAR = 1.03  # tuning.canary_min_gain's default


@cache
def before() -> tuple[Sample, ...]:
    servers = [ModeledServer(f"server-{i}", START, in_flight=CLIENT) for i in range(2)]
    return tuple(sampled_fleet(HW, servers, PROMPT, LENGTHS, until=6 * WINDOW))


@cache
def diagnosis() -> Diagnosis:
    rows = list(before())
    plan = plan_memory(HW.model, HW.gpu, START, HW.version)
    caps = {f"server-{i}": plan.max_running_requests for i in range(2)}
    return diagnose(window_stats(rows, rows[-1].t - 2 * WINDOW, 1.0), caps, plan)


@cache
def move() -> Proposal:
    proposal = propose(diagnosis(), START, CLIENT,
                       Search(HW, tried=frozenset({config_key(START, CLIENT)})))
    assert proposal is not None, diagnosis()
    return proposal


def test_the_start_is_diagnosed_mamba_bound_at_its_cap_of_16() -> None:
    assert plan_memory(HW.model, HW.gpu, START, HW.version).max_running_requests == 16
    found = diagnosis()
    assert found.kind == "mamba-bound", found
    assert "80 slots / 5 per request under extra_buffer" in found.evidence, found.evidence


def test_the_move_raises_the_cap_and_keeps_mtp() -> None:
    flags = move().flags
    assert flags.speculative_algorithm == "EAGLE" and flags.speculative_num_steps == 3
    assert plan_memory(HW.model, HW.gpu, flags, HW.version).max_running_requests > 16
    gain = move().predicted_gain
    assert gain is not None and gain > 1.5


def test_the_canary_beats_the_control_and_is_rolled_out() -> None:
    verdict = first_verdict(list(canary_beside_control()), WINDOW, 3 * WINDOW, 12 * WINDOW,
                            {"server-1"}, BAR)
    assert verdict is not None and verdict.decision == "better", verdict
    assert verdict.gain is not None and verdict.gain > 1.5
    # What the move promised is what the canary measured, within the tuner's own bar for a
    # prediction (docs/TUNING.md: 15 %).
    predicted = move().predicted_gain or 0.0
    assert abs(predicted / verdict.gain - 1) < 0.15, (predicted, verdict)


class ModeledClock:
    """The monitor and the abort event of a canary cycle, on the modeled series: waiting
    advances the clock, a snapshot holds what was scraped by then."""

    def __init__(self, rows: list[Sample]) -> None:
        self.rows, self.t = rows, 0.0

    def now(self) -> float:
        return self.t

    def snapshot(self) -> list[Sample]:
        return [s for s in self.rows if s.t <= self.t]

    def feed_snapshot(self) -> list[FeedSample]:
        """A modeled client always keeps up: no CPU-wait samples, so no window is starved."""
        return []

    def wait(self, seconds: float) -> bool:
        self.t += seconds
        return False

    def is_set(self) -> bool:
        return False


class RecordedFleet:
    """Two servers on the start config; a restart is recorded, not made."""

    def __init__(self, settings: JobSettings) -> None:
        self.job = settings
        self.config_of = dict.fromkeys((0, 1), FleetConfig.of(settings))
        self.restarted: list[tuple[int, str]] = []

    def capacities(self) -> list[Capacity]:
        return [Capacity(i, "", None, 16, 1, None, None, "") for i in sorted(self.config_of)]

    def replace(self, index: int, config: FleetConfig, tag: str) -> Replaced:
        self.restarted.append((index, tag))
        self.config_of[index] = config
        cap = Capacity(index, "", None, 16, 1, None, None, "")
        return Replaced(index, cap, 0.0, 0.0, 0)


def paying_above(need: float) -> Callable[[float, float], bool]:
    return lambda gain, _restart_s: gain >= need


@cache
def canary_beside_control() -> tuple[Sample, ...]:
    """server-1 restarted onto the move at t=0, server-0 on the start for 200 s before."""
    canary = ModeledServer("server-1", move().flags)  # restarted: cap + 4 in flight
    control = ModeledServer("server-0", START, warm_s=200.0, in_flight=CLIENT)
    return tuple(sampled_fleet(HW, [canary, control], PROMPT, LENGTHS, until=12 * WINDOW))


def test_a_won_canary_the_work_left_cannot_pay_for_stays_a_canary() -> None:
    """Near the job's end the others keep their config: CI's run rolled a won canary out
    while the work ran out. With work to spare, the same verdict rolls out."""
    current = load_settings(None, **{"tuning.window_s": WINDOW})
    candidate = move().config
    rows = list(canary_beside_control())
    outcomes = {}
    for need in (1.1, 50.0):  # the gain the work left asks of a restart
        fleet, clock = RecordedFleet(current), ModeledClock(rows)
        run = CanaryRun(fleet, clock, 1.0, logging.getLogger("test"), clock,  # type: ignore[arg-type]
                        paying_above(need))
        cycle = run.run(FleetConfig.of(current), candidate, move().predicted_gain)
        outcomes[need] = (cycle.outcome, fleet.restarted)
    assert outcomes[1.1] == ("rolled_out", [(1, "canary"), (0, "rollout")]), outcomes
    assert outcomes[50.0] == ("canary_only", [(1, "canary")]), outcomes
