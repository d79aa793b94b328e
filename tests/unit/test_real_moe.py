"""Two MoE hybrids no earlier calibration had seen, on real SGLang 0.5.17 (H200, dummy
weights; bench/real_sglang/data/2026-12-03-h200-s16, `device.sh long plans/moe_s16_*.json`):
the Qwen3.6-35B-A3B text shapes (GDN + 256 experts) and Kimi-Linear-48B-A3B (KDA + MLA + 256
experts). The memory model, the MoE step model (fitted on the 35B's decode lines; for Kimi
only its dummy routing spread and its MLA attention's share of peak, bench/real_sglang/
fit_moe.py) and the plan's committed rate, checked against what ran."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from infra.sglang.memory import covering_graphs, plan_memory
from infra.sglang.profiles import model_profile
from infra.sim.predict import Workload, committed_tok_s

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "real_sglang"))
from fit_moe import (
    H200,
    MODELS,
    V0517,
    WEIGHTS_GIB,
    levels,
    predicted_step,
    records,
    server_flags,
    steady_wave_tok_s,
)

from infra.sglang.roofline import calibration_for

RECORDS = {rec["name"]: rec for rec in records()}
EAGER = "q35_nb_bf16"  # cap 313 with SGLang's default decode graphs (256): eager above them


def setup(name: str) -> tuple[Any, Any, dict[str, Any]]:
    rec = RECORDS[name]
    return (model_profile(str(MODELS / rec["model"]), WEIGHTS_GIB[rec["model"]]),
            server_flags(rec["flags"]), rec)


def plan_of(name: str) -> Any:
    model, flags, _ = setup(name)
    return plan_memory(model, H200, flags, V0517)


def wave(rec: dict[str, Any]) -> dict[str, Any]:
    return next(r for r in rec["runs"] if r["name"] == "wave")


def test_the_device_ran_seven_servers_and_one_died_of_eager_attention() -> None:
    assert set(RECORDS) == {"q35_default", "q35_eb", EAGER, "q35_nb_bf16_g320",
                            "kimi_default", "kimi_nb_bf16", "kimi_nb_bf16_g320"}
    assert "ConnectError" in RECORDS["kimi_nb_bf16"]["error"]


ONE_SLOT_HIGH = {"q35_nb_bf16_g320"}
"""Open: with bf16 SSM state the model sizes one 31-MiB slot more than SGLang did (941/940,
939/938); at 938 slots that crosses a multiple of 3, so this server's cap is 313 to SGLang's
312. Every other pool is exact."""


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_pools_are_exact(name: str) -> None:
    model, flags, rec = setup(name)
    plan = plan_memory(model, H200, flags, V0517)
    assert abs(plan.mamba_slots - rec["max_mamba_cache_size"]) <= 1
    assert plan.max_total_num_tokens == pytest.approx(rec["max_total_num_tokens"], rel=0.01)
    if name in ONE_SLOT_HIGH:
        assert plan.mamba_slots == rec["max_mamba_cache_size"] + 1
        assert plan.max_running_requests == rec["max_running_requests"] + 1
    else:
        assert plan.max_running_requests == rec["max_running_requests"]


def test_the_default_plans_are_what_sglang_resolved() -> None:
    qwen = plan_of("q35_default")
    kimi = plan_of("kimi_default")
    assert (qwen.mamba_strategy, qwen.overlap_schedule, qwen.max_running_requests) == (
        "no_buffer", True, 160)
    assert (kimi.mamba_strategy, kimi.overlap_schedule, kimi.max_running_requests) == (
        "extra_buffer", True, 80)


STEP_OFF = {"kimi_nb_bf16_g320": (
    "open: this server's step at 320 running (20.2 ms) is faster than the s19 server's at "
    "256 with the same flags but the cap (22.1 ms): 63 against 86 us a request, which no term "
    "of the model explains; the MLA term fitted on every Kimi level puts it at +28 %")}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(reason=STEP_OFF[n], strict=True)) if n in STEP_OFF
    else n for n in sorted(RECORDS)])
def test_decode_steps_within_15_percent(name: str) -> None:
    """Every steady decode level of every server, the held-out Kimi included."""
    model, _, rec = setup(name)
    cal = calibration_for(H200, model)
    for level in levels(rec):
        assert predicted_step(level, cal) == pytest.approx(level.step_s, rel=0.15), level


WAVES = sorted(n for n, r in RECORDS.items() if "error" not in r)


@pytest.mark.parametrize("name", WAVES)
def test_plan_commits_a_wave_at_the_cap_within_15_percent(name: str) -> None:
    model, flags, rec = setup(name)
    predicted = committed_tok_s(model, H200, flags, V0517, Workload(1024, 256))
    assert predicted == pytest.approx(steady_wave_tok_s(wave(rec)), rel=0.15)


def test_a_cap_past_the_graphs_is_planned_eager_and_raised_with_graphs() -> None:
    """The 35B's no_buffer + bf16 move at cap 313 ran 2,944 tok/s eager (slower than the
    default's 4,088) and 4,809 with graphs to 320; the plan says so and raises them."""
    model, flags, _ = setup(EAGER)
    plan = plan_memory(model, H200, flags, V0517)
    assert (plan.graph_max_bs, plan.graphs_cover_cap) == (256, False)
    lifted = covering_graphs(flags, plan)
    assert lifted is not None and lifted.graph_max_bs == 313
    eager = committed_tok_s(model, H200, flags, V0517, Workload(1024, 256))
    graphed = committed_tok_s(model, H200, lifted, V0517, Workload(1024, 256))
    default_model, default_flags, _ = setup("q35_default")
    default = committed_tok_s(default_model, H200, default_flags, V0517, Workload(1024, 256))
    assert eager < default < graphed
    real = {n: steady_wave_tok_s(wave(RECORDS[n])) for n in (EAGER, "q35_default",
                                                             "q35_nb_bf16_g320")}
    assert real[EAGER] < real["q35_default"] < real["q35_nb_bf16_g320"]


def test_the_long_mixed_run_is_replayed_within_15_percent() -> None:
    """600 rows, lognormal mean 2,000 / p99 12,000 up to 12,288, at the default's cap 160."""
    from infra.sim.replay import replay_requests

    model, flags, rec = setup("q35_default")
    run = next(r for r in rec["runs"] if r["name"] == "long-mixed")
    sim = replay_requests(model, H200, flags, V0517, [tuple(r) for r in run["requests_list"]],
                          run["concurrency"], max_s=run["wall_s"])  # what the run counted
    assert sim.committed_tok_s == pytest.approx(run["committed_tok_s"], rel=0.15)
