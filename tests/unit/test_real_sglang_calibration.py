"""The memory model, the step-time model and the simulator's accounting against real SGLang.

The logs are SGLang 0.5.17's own, captured on the H200 (tests/fixtures/sglang-0.5.17/, from
bench/real_sglang/calibrate.py); bench/real_sglang/fit.py derives the constants these tests
hold the models to. A change to either model that drifts from the measurement fails here.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import pytest

from infra.sglang.flags import ServerFlags
from infra.sglang.memory import plan_memory
from infra.sglang.observe import parse_log
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.roofline import DEFAULT_CALIBRATION, build_roofline, calibration_for
from infra.sglang.versions import parse_version
from infra.sim.scheduler import tracking_slots

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REAL = FIXTURES / "sglang-0.5.17"
MODEL = model_profile(str(FIXTURES / "models" / "qwen3.6-27b-text"), 50.16)
H200 = gpu_profile("h200")
V0517 = parse_version("0.5.17")
FLAGS = {
    "no_buffer": ServerFlags(mamba_strategy="no_buffer", mem_fraction_static=0.9,
                             disable_overlap_schedule=True),
    "extra_buffer": ServerFlags(mamba_strategy="extra_buffer", mem_fraction_static=0.9),
}
CONTEXT = 1024 + 128  # the calibration's prompt plus half its output


def startup_values(strategy: str) -> dict[str, int]:
    values: dict[str, int] = {}
    for rec in parse_log((REAL / f"{strategy}.server.log").read_text()):
        if rec["kind"] == "startup":
            values.update({k: v for k, v in rec.items() if isinstance(v, int)})
    return values


def decode_medians(strategy: str) -> dict[int, tuple[float, float]]:
    """#running-req → (median step seconds, median live states per request)."""
    lines: dict[int, list[dict]] = defaultdict(list)
    for rec in parse_log((REAL / f"{strategy}.server.log").read_text()):
        if rec["kind"] == "decode" and rec["running_req"] and rec["gen_throughput"]:
            lines[rec["running_req"]].append(rec)
    return {n: (statistics.median(n / r["gen_throughput"] for r in rs),
                statistics.median(r["mamba_num"] / n for r in rs))
            for n, rs in lines.items() if len(rs) >= 5}


@pytest.mark.parametrize("strategy", sorted(FLAGS))
def test_memory_model_gives_the_real_pools(strategy: str) -> None:
    real = startup_values(strategy)
    plan = plan_memory(MODEL, H200, FLAGS[strategy], V0517)
    assert plan.mamba_slots == real["max_mamba_cache_size"]
    assert plan.max_running_requests == real["max_running_requests"]
    assert abs(plan.max_total_num_tokens / real["max_total_num_tokens"] - 1) < 0.001


@pytest.mark.parametrize("strategy", sorted(FLAGS))
def test_h200_step_model_matches_every_measured_level(strategy: str) -> None:
    plan = plan_memory(MODEL, H200, FLAGS[strategy], V0517)
    roof = build_roofline(MODEL, H200, FLAGS[strategy], plan)
    assert roof.calibration == calibration_for(H200) != DEFAULT_CALIBRATION
    measured = decode_medians(strategy)
    assert len(measured) >= 8
    for running, (step_s, _) in measured.items():
        assert roof.decode_step_s(running, CONTEXT) == pytest.approx(step_s, rel=0.05)


def test_seed_fit_overstates_the_extra_buffer_cost_on_the_h200() -> None:
    """Why the simulator follows the H200 data there: the seeds' tracking term doubles the
    extra_buffer step at 49 running, the H200 shows no such term."""
    plan = plan_memory(MODEL, H200, FLAGS["extra_buffer"], V0517)
    seed = build_roofline(MODEL, H200, FLAGS["extra_buffer"], plan, calibration=DEFAULT_CALIBRATION)
    step_s, _ = decode_medians("extra_buffer")[49]
    assert seed.decode_step_s(49, CONTEXT) > 1.8 * step_s
    assert calibration_for(H200).extra_buffer_tracking_slots == 0.0


@pytest.mark.parametrize(("strategy", "overlap"), [("no_buffer", False), ("extra_buffer", True)])
def test_simulated_live_states_per_request_match_the_decode_lines(strategy: str,
                                                                  overlap: bool) -> None:
    live = {round(per_request, 2) for _, per_request in decode_medians(strategy).values()}
    assert live == {float(tracking_slots(strategy, overlap, V0517.locks_prefix_state))}
