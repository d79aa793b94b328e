"""The 35B-A3B text shapes (GDN + 256 experts) on an H100, on real SGLang 0.5.17 (dummy weights;
bench/real_sglang/data/2026-12-07-h100-s31, `device.sh long plans/blind_q35_h100.json`): an
MoE of a family whose only fit is the H200's. The planner prices it with that fit, borrowed for
a GPU of the same generation (infra/sglang/roofline.py: calibration_key), and says so (±50 %).
Its answers were committed before the run (plans/blind_q35_h100.predicted-h100.json), so every
figure below was predicted blind: the pools, the wave at the cap and long mixed outputs. That
record priced real weights (1,170 wave, 1,222 long); the device ran dummy ones, which route a
batch's tokens to fewer experts (roofline.py: dummy_routed_spread), and the same planner, at
the record's commit, says 1,221 and 1,279 for what ran."""

from __future__ import annotations

import json
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from infra.sglang.calibration_note import calibration_note
from infra.sglang.flag_parser import parse_server_flags
from infra.sglang.memory import plan_memory
from infra.sglang.profiles import model_profile
from infra.sim.predict import Workload, committed_tok_s

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "real_sglang"))
import fit_h100  # noqa: E402
from fit_moe import MODELS, V0517, WEIGHTS_GIB, server_flags, steady_wave_tok_s  # noqa: E402

PLANS = ROOT / "bench" / "real_sglang" / "plans"
PART = ("2026-12-07-h100-s31", "q35h")
Q35 = model_profile(str(MODELS / "qwen3.6-35b-a3b-text"), WEIGHTS_GIB["qwen3.6-35b-a3b-text"])
WAVE = Workload(1024, 256)
LONG = Workload(1152, 2000, 12000)  # probe_long's long mixed: prompts 256-2,048, mean 2,000


@cache
def ran() -> dict[str, Any]:
    (rec,) = fit_h100.servers((PART,))
    return rec


def run_named(name: str) -> dict[str, Any]:
    return dict(next(r for r in ran()["runs"] if r["name"] == name))


def blind(run: str) -> dict[str, Any]:
    said = json.loads((PLANS / "blind_q35_h100.predicted-h100.json").read_text())
    return dict(next(p for p in said if p["run"] == run))


def planned(workload: Workload) -> float:
    """The planner's figure for the server that ran (its flags, dummy weights)."""
    return committed_tok_s(Q35, fit_h100.H100, server_flags(ran()["flags"]), V0517, workload)


def planned_for_real_weights(workload: Workload) -> float:
    flags = parse_server_flags([f for f in ran()["flags"] if f != "--skip-tokenizer-init"],
                               V0517)
    return committed_tok_s(Q35, fit_h100.H100, flags, V0517, workload)


def test_the_planner_says_the_fit_is_borrowed_and_how_unsure_it_is() -> None:
    note = calibration_note(fit_h100.H100, Q35)
    assert (note.key, note.calibrated, note.uncertainty) == ("H200/gdn-moe", False, 0.5)


def test_pools_cap_exact_slots_within_one_kv_within_1_percent() -> None:
    rec = ran()
    plan = plan_memory(Q35, fit_h100.H100, server_flags(rec["flags"]), V0517)
    assert (plan.mamba_strategy, plan.slot_ratio) == ("no_buffer", 3)
    assert plan.max_running_requests == rec["max_running_requests"] == 21
    assert abs(plan.mamba_slots - rec["max_mamba_cache_size"]) <= 1
    assert plan.max_total_num_tokens == pytest.approx(rec["max_total_num_tokens"], rel=0.01)


def test_the_wave_at_the_cap_within_15_percent_of_its_steady_rate() -> None:
    """1,221 planned against 1,229 steady (1,110 over the whole wave, its first request
    compiling kernels)."""
    assert planned(WAVE) == pytest.approx(steady_wave_tok_s(run_named("wave")), rel=0.15)


def test_long_mixed_outputs_within_15_percent_of_a_full_batch() -> None:
    """1,279 planned against 1,257 generated while the batch was full; the run's committed
    903 counts none of the long answers still running when its 150 s ended."""
    rec = ran()
    full = fit_h100.full_batch_rate(rec, run_named("long-mixed"))
    assert planned(LONG) == pytest.approx(full, rel=0.15)


@pytest.mark.parametrize(("run", "workload"), [("wave", WAVE), ("long-mixed", LONG)])
def test_the_blind_record_is_what_the_planner_still_says(run: str, workload: Workload) -> None:
    """The planner checked above is the one that made the blind record, not a later refit."""
    assert planned_for_real_weights(workload) == pytest.approx(
        blind(run)["committed_tok_s_per_gpu"], rel=0.01)
    assert blind(run)["max_running_requests"] == ran()["max_running_requests"]


def test_dummy_weights_are_priced_faster_than_real_ones() -> None:
    """Fewer experts read a step under dummy routing: the figure that ran is 4 % above the
    real-weight one, the direction the device's 35B runs on the H200 fitted."""
    assert planned(WAVE) / planned_for_real_weights(WAVE) == pytest.approx(1.043, abs=0.01)
