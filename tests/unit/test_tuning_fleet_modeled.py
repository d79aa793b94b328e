"""Two tuning decisions whose thresholds a loaded box had loosened (#25), made in modeled
time on a modeled fleet (bench/fleet_model.py: the simulator's scheduler per server, the
dispatcher's one queue, a virtual clock), where CPU speed cannot move them:

- a canary that loses is rolled back while the other servers keep generating: the fleet's
  lowest decode rate during the cycle (tasks/tuning/canary.min_fleet_fraction, over half
  windows as the cycle reads it) stays near 3 of 4 servers — the e2e test's bar had gone
  from 0.3 to 0.05 because a busy box's scrapes read stopped servers;
- a GPU at 0.35× (the e2e test went to 0.15×: on a loaded box the healthy servers slowed
  too) is found slow in every check of two windows running, alone.

The flow's own runs of both stay in tests/e2e/test_tuning.py for their mechanics (who
restarts, what the report says), without the thresholds.
"""

from __future__ import annotations

import asyncio
import sys
from functools import cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from fleet_model import ModeledFleet, run_modeled

from infra.sglang.flags import ServerFlags
from infra.sglang.hardware import Hardware
from infra.sglang.memory import plan_memory
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.versions import parse_version
from infra.sim.predict import Workload
from tasks.monitor import Sample
from tasks.tuning.canary import MIN_JUDGE_WINDOWS, min_fleet_fraction
from tasks.tuning.diagnosis import diagnose, slow_servers, window_stats
from tasks.tuning.judge import Verdict, judge

HW = Hardware(model_profile("qwen3.6-27b-fp8"), gpu_profile("rtx-pro-6000"),
              parse_version("0.5.23"))
START = ServerFlags(mamba_strategy="extra_buffer")
MOVE = ServerFlags(mamba_strategy="no_buffer")
PROMPT = 64
LENGTHS = [min(1024, n) for n in Workload(PROMPT, 500, 2000).output_lengths(20000, seed=5)]
WINDOW = 20.0  # modeled seconds (tuning.window_s)
TICK = 1.0
STARTUP = 30.0


@cache
def rolled_back() -> tuple[tuple[Sample, ...], float, float, Verdict]:
    """Four servers on the start; server-3 restarts on the move, is judged against a bar no
    move clears (50×) and goes back."""
    async def cycle() -> tuple[tuple[Sample, ...], float, float, Verdict]:
        fleet = ModeledFleet(HW, LENGTHS, PROMPT, 1024, STARTUP, clients=40)
        for i in range(4):
            fleet.launch(f"server-{i}", START)
        samples: list[Sample] = []
        monitor = asyncio.create_task(fleet.monitor(TICK, samples))
        await asyncio.sleep(STARTUP + 6 * WINDOW)
        start = fleet.now()
        await fleet.stop("server-3", 3.0)
        await fleet.launch("server-3", MOVE)
        since = fleet.now()
        verdict = Verdict("wait", None, None, False, "")
        while verdict.decision == "wait":
            await asyncio.sleep(WINDOW)
            if fleet.now() - since >= MIN_JUDGE_WINDOWS * WINDOW:
                verdict = judge(samples, since, fleet.now(), {"server-3"}, 1.0, 50.0,
                                final=fleet.now() - since >= 20 * WINDOW)
        await fleet.stop("server-3", 3.0)
        await fleet.launch("server-3", START)
        await asyncio.sleep(WINDOW)
        assert fleet.queue, "the job ran out of work before the cycle ended"
        monitor.cancel()
        return tuple(samples), start, fleet.now(), verdict

    return run_modeled(cycle())


def test_the_losing_canary_measured_faster_but_not_by_the_bar() -> None:
    *_, verdict = rolled_back()
    assert verdict.decision == "keep", verdict
    assert verdict.gain is not None and verdict.gain > 1.5, verdict


def test_the_fleet_keeps_three_of_four_servers_generating_through_the_cycle() -> None:
    samples, start, end, _ = rolled_back()
    low = min_fleet_fraction(list(samples), start, end, WINDOW / 2)
    # The restored bar is 0.3 (issue #25); 3 of 4 servers is 0.75, less their waves.
    assert low is not None and low > 0.6, low
    assert low < 0.9, low  # the canary really was out while it restarted


@cache
def degraded() -> tuple[Sample, ...]:
    async def run() -> tuple[Sample, ...]:
        fleet = ModeledFleet(HW, LENGTHS, PROMPT, 512, STARTUP, clients=None)
        for i in range(3):
            fleet.launch(f"server-{i}", MOVE, speed=0.35 if i == 2 else 1.0)
        samples: list[Sample] = []
        monitor = asyncio.create_task(fleet.monitor(TICK / 4, samples))
        await asyncio.sleep(STARTUP + 8 * WINDOW)
        monitor.cancel()
        return tuple(samples)

    return run_modeled(run())


def test_a_gpu_at_035x_is_slow_in_every_check_of_two_windows_and_alone() -> None:
    """The watch checks every min(1 s, window / 4) and repairs a server slow in all checks of
    two windows running (tasks/tuning/watch.py: `_repaired`)."""
    samples = list(degraded())
    plan = plan_memory(HW.model, HW.gpu, MOVE, HW.version)
    caps = {f"server-{i}": plan.max_running_requests for i in range(3)}
    end = samples[-1].t
    checks = [end - 2 * WINDOW + k for k in range(int(2 * WINDOW) + 1)]
    found = []
    for t in checks:
        rows = [s for s in samples if s.t <= t]
        diag = diagnose(window_stats(rows, t - WINDOW, 1.0), caps, plan)
        found.append((diag.kind, [name for name, _, _ in slow_servers(diag)]))
    assert all(f == ("asymmetric", ["server-2"]) for f in found), found
