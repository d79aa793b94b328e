"""Nemotron-3-Nano-30B-A3B's shapes (`NemotronHForCausalLM`: 23 Mamba2, 23 MoE layers of 128
experts top-6 with a shared expert, 6 attention; 3.6 B active) in four configurations on an
H100, real SGLang 0.5.17, dummy weights, the triton MoE runner (bench/real_sglang/data/
2026-12-07-h100-s34: `device.sh long plans/blind_nemotron30_h100_waves.json`, then
`plans/blind_nemotron30_h100_long.json`). The default MoE runner for an unquantized NemotronH
on SM90 is flashinfer_cutlass (`_nemotron_h_overrides` in srt/arg_groups/overrides.py); its
autotune had not finished 480 s after the weights loaded (part `nhw`), so every server here
names triton.

Blind, before the run (`plans/blind_nemotron30_h100_*.predicted-h100.json`, weights 58.82 GiB
from the config's parameter count): caps right but one (162 for 161), every rate 38-66 % low.
The cause: a random-weight NemotronH router (grouped sigmoid top-k with a correction bias, as
Kimi-Linear's) sends a batch to about top-k experts, and the planner priced it as a trained
one. The H100's Mamba2 + MoE fit has since taken the four waves (fit_h100.PARTS) and measured
that spread (0.02); the long-mixed servers are held out."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from infra.sglang.calibration_note import calibration_note
from infra.sglang.memory import plan_memory
from infra.sglang.roofline import calibration_for
from infra.sim.predict import Workload

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "real_sglang"))
import fit_h100 as fit
from h100_runs import only_run, planned, servers

FOLDER = "2026-12-07-h100-s34"
WAVES = ((FOLDER, "nhw2"),)
LONG_RUNS = ((FOLDER, "nhl"),)
NAME = "nemotron-3-nano-30b-a3b"
MODEL = fit.step_model(NAME)
WAVE = Workload(1024, 256)
LONG = Workload(1152, 2000, 12000)  # probe_long's long mixed: prompts 256-2,048, mean 2,000
PLANS = fit.ROOT / "bench" / "real_sglang" / "plans"


def blind_record(name: str, plan: str = "waves") -> dict[str, Any]:
    path = PLANS / f"blind_nemotron30_h100_{plan}.predicted-h100.json"
    return dict(next(p for p in json.loads(path.read_text()) if p["server"] == name))


def test_every_server_answered_everything_it_was_sent_and_ran_triton_moe() -> None:
    recs = servers(WAVES) + servers(LONG_RUNS)
    assert len(recs) == 6
    for rec in recs:
        run = only_run(rec)
        assert run["errors"] == 0 and run["answered"] > 0
        assert rec["flags"][-2:] == ["--moe-runner-backend", "triton"]
        if run["workload"] == "fixed":
            assert run["answered"] == run["requests_sent"]


@pytest.mark.parametrize("index", range(6))
def test_pools_cap_exact_slots_within_one_kv_within_1_percent(index: int) -> None:
    """With the bytes the load took (58.92 GiB): caps 13, 95, 161, 57, slots and KV within
    0.12 %."""
    rec = (servers(WAVES) + servers(LONG_RUNS))[index]
    plan = plan_memory(fit.loaded_model(NAME), fit.H100, fit.server_flags(rec["flags"]),
                       fit.V0517)
    assert plan.max_running_requests == rec["max_running_requests"]
    assert abs(plan.mamba_slots - rec["max_mamba_cache_size"]) <= 1
    assert plan.max_total_num_tokens == pytest.approx(rec["max_total_num_tokens"], rel=0.01)


@pytest.mark.parametrize("index", range(4))
def test_the_blind_record_had_the_caps_and_every_rate_far_too_low(index: int) -> None:
    """What the planner said before the run: caps 13, 95, 162, 57 (161 ran: 0.1 GiB of load
    overhead over the parameters' bytes moved 3 slots); 775, 2,141, 2,875, 1,614 tok/s
    against 2,263, 4,327, 4,672, 4,510 steady (-66 %, -51 %, -38 %, -64 %)."""
    rec = servers(WAVES)[index]
    said = blind_record(rec["name"])
    assert abs(said["max_running_requests"] - rec["max_running_requests"]) <= 1
    error = said["committed_tok_s_per_gpu"] / fit.measured_rate(only_run(rec)) - 1
    assert -0.67 < error < -0.37


@pytest.mark.parametrize("index", range(4))
def test_each_wave_at_the_cap_within_15_percent_of_its_steady_rate(index: int) -> None:
    """Fitted on (the step at its batch): 2,081, 3,985, 4,436, 3,861 planned against 2,263,
    4,327, 4,672, 4,510 (-8 %, -8 %, -5 %, -14 %). The step itself is within 5 % at every
    batch; what the waves miss is the prefill, which random routing makes fast here (its
    8,192-token chunks reach 0.96 of peak, against the 0.45 the fit takes: fit_h100)."""
    rec = servers(WAVES)[index]
    assert planned(rec, WAVE) == pytest.approx(fit.measured_rate(only_run(rec)), rel=0.15)


@pytest.mark.parametrize("index", range(1, 4))
def test_every_moves_gain_over_the_default_flags_within_10_percent(index: int) -> None:
    """Over the default flags' server (extra_buffer, fraction 0.835: cap 13): 1.92× planned /
    1.91× measured (no_buffer + bf16 state + fraction 0.93, cap 95), 2.13 / 2.06 (and mamba
    ratio 4, cap 161: the best, as the blind plan ranked it), 1.86 / 1.99 (extra_buffer + bf16
    + 0.93, cap 57)."""
    default, rec = servers(WAVES)[0], servers(WAVES)[index]
    plan = planned(rec, WAVE) / planned(default, WAVE)
    real = fit.measured_rate(only_run(rec)) / fit.measured_rate(only_run(default))
    assert plan == pytest.approx(real, rel=0.10)


@pytest.mark.parametrize("index", range(2))
def test_held_out_long_mixed_outputs_within_15_percent(index: int) -> None:
    """4,768 planned against 5,593 generated while the batch of 95 was full (-15 %: the
    prefill again); 2,324 against 2,449 at cap 13 (-5 %). Replayed, the runs' committed rates
    (4,529, 2,211) come out -8 % and +1 %."""
    rec = servers(LONG_RUNS)[index]
    run = only_run(rec)
    assert planned(rec, LONG) == pytest.approx(fit.full_batch_rate(rec, run), rel=0.15)
    assert fit.replayed_rate(rec, run, None) == pytest.approx(fit.measured_rate(run), rel=0.15)


@pytest.mark.parametrize("index", range(6))
def test_the_step_within_10_percent_at_every_batch(index: int) -> None:
    levels = fit.step_levels(list(servers(WAVES) + servers(LONG_RUNS)))
    assert len(levels) == 6
    level = levels[index]
    predicted = fit.predicted_step(level, calibration_for(fit.H100, MODEL))
    assert predicted == pytest.approx(level.step_s, rel=0.10)


def test_the_long_runs_are_not_in_the_fit_and_the_dummy_spread_is_measured() -> None:
    assert not set(LONG_RUNS) & set(fit.PARTS) and set(WAVES) <= set(fit.PARTS)
    cal = calibration_for(fit.H100, MODEL)
    assert dict(cal.dummy_routed_spread)[MODEL.architecture] == 0.02
    dummy = fit.server_flags(servers(WAVES)[0]["flags"])
    note = calibration_note(fit.H100, MODEL, dummy)
    assert note.calibrated and not note.dummy_routing_unmeasured and note.uncertainty == 0.15


def test_blind_the_planners_best_move_was_the_best_the_device_measured() -> None:
    """What #38 found on the 35B (the top move ran slower than the defaults) did not happen
    here, though every blind rate was 38-66 % low: mamba ratio 4 was first blind (3.71× the
    defaults) and measured (2.06×), and every move measured faster than the defaults."""
    recs = servers(WAVES)
    blind = {r["name"]: blind_record(r["name"])["committed_tok_s_per_gpu"] for r in recs}
    real = {r["name"]: fit.measured_rate(only_run(r)) for r in recs}
    assert max(blind, key=blind.__getitem__) == max(real, key=real.__getitem__) == \
        "nh30_nb_bf16_m093_r4_h100"
    assert min(real, key=real.__getitem__) == "nh30_default_h100"
