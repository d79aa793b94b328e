"""The H100's Mamba2 + MoE step model against what real SGLang 0.5.17 did on Granite-4.0-H-Tiny's
shapes (bench/real_sglang/data/2026-12-06-h100-s24, -s25, -s26; fitted by
bench/real_sglang/fit_h100.py into `H100 80GB/mamba2-moe`).

Five configurations: the default flags (extra_buffer, overlap on, cap 92), no_buffer fp32 (153),
no_buffer bf16 with graphs raised to 320 (302), the same at batch levels 64-256, and no_buffer
bf16 with the default graphs (256) at 8, 16, 256 and its cap of 303, which ran eager. What is
held: the shipped constants are the fit's; every steady step within 10 %; every run replayed
(its rows, clients, deadline) within 15 %; the planner's figure for each wave within 15 % and
its ratio to the default within 10 %; long mixed outputs within 15 % of what the server
generated while its batch was full; the planner calls the family calibrated. Held out: an
extra_buffer + bf16 SSM server run after the fit, its figures predicted before it ran."""

from __future__ import annotations

import json
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from infra.sglang.calibration_note import calibration_note
from infra.sglang.roofline import CALIBRATION_FILE, measured_calibrations
from infra.sim.predict import Workload, committed_tok_s

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "real_sglang"))
import fit_h100 as fit

WAVE = Workload(1024, 256)
LONG = Workload(1152, 2000, 12000)  # probe_long's long mixed: prompts 256-2,048, mean 2,000


@cache
def servers() -> tuple[dict[str, Any], ...]:
    return tuple(fit.servers())


def runs() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(rec, run) for rec in servers() for run in rec["runs"]]


def server(name: str) -> dict[str, Any]:
    return next(rec for rec in servers() if rec["name"] == name)


def wave_of(rec: dict[str, Any]) -> dict[str, Any]:
    return dict(next(r for r in rec["runs"] if r["name"] == "wave"))


def planned(rec: dict[str, Any], workload: Workload) -> float:
    return committed_tok_s(fit.step_model(rec["model"]), fit.H100,
                           fit.server_flags(rec["flags"]), fit.V0517, workload)


def test_the_shipped_constants_are_what_the_fit_gives() -> None:
    shipped = json.loads(CALIBRATION_FILE.read_text())[fit.ENTRY]
    again = fit.entry(fit.fit(list(servers())))
    assert shipped == again


def test_the_planner_calls_this_family_calibrated_on_the_h100() -> None:
    note = calibration_note(fit.H100, fit.TINY)
    assert note.calibrated and note.key == "H100 80GB/mamba2-moe"


def test_the_data_holds_a_batch_past_the_graphs_and_five_batch_sizes_or_more() -> None:
    levels = fit.step_levels(list(servers()))
    assert {lv.running for lv in levels} >= {8, 16, 32, 64, 92, 128, 153, 192, 256, 302, 303}
    eager = [lv for lv in levels if not fit._graphed(lv)]
    assert [(lv.server, lv.running) for lv in eager] == [("gt_nb_bf16_eager", 303)]


@pytest.mark.parametrize("level", fit.step_levels(list(servers())),
                         ids=lambda lv: f"{lv.server}-{lv.run}-{lv.running}")
def test_every_steady_step_within_10_percent(level: fit.Level) -> None:
    shipped = measured_calibrations()[fit.ENTRY]
    assert fit.predicted_step(level, shipped) == pytest.approx(level.step_s, rel=0.10)


@pytest.mark.parametrize(("rec", "run"), runs(), ids=lambda x: x["name"])
def test_every_run_is_replayed_within_15_percent(rec: dict[str, Any],
                                                 run: dict[str, Any]) -> None:
    assert fit.replayed_rate(rec, run, None) == pytest.approx(fit.measured_rate(run), rel=0.15)


@pytest.mark.parametrize("name", ["gt_default", "gt_nb_nov", "gt_nb_bf16_g320_nov",
                                  "gt_nb_bf16_eager"])
def test_the_wave_at_the_cap_is_planned_within_15_percent(name: str) -> None:
    rec = server(name)
    assert planned(rec, WAVE) == pytest.approx(fit.measured_rate(wave_of(rec)), rel=0.15)


@pytest.mark.parametrize("name", ["gt_nb_nov", "gt_nb_bf16_g320_nov", "gt_nb_bf16_eager"])
def test_every_moves_gain_over_the_defaults_within_10_percent(name: str) -> None:
    """The eager cap is a loss (0.77x measured, 0.81x planned) and is planned as one."""
    default, move = server("gt_default"), server(name)
    plan = planned(move, WAVE) / planned(default, WAVE)
    real = fit.measured_rate(wave_of(move)) / fit.measured_rate(wave_of(default))
    assert plan == pytest.approx(real, rel=0.10)
    if name == "gt_nb_bf16_eager":
        assert plan < 1 and real < 1


@pytest.mark.parametrize("name", ["gt_default", "gt_nb_bf16_g320_nov"])
def test_long_mixed_outputs_are_planned_within_15_percent_of_a_full_batch(name: str) -> None:
    """A 600-request run of 180 s is mostly ramp and tail (its committed rate counts none of
    the long answers still running at the end): the planner's steady figure is held to what
    the server generated while its batch was full (decode lines at ≥ 95 % of the cap)."""
    rec = server(name)
    (run,) = [r for r in rec["runs"] if r["workload"] == "lognormal"]
    assert planned(rec, LONG) == pytest.approx(fit.full_batch_rate(rec, run), rel=0.15)


def held_out() -> dict[str, Any]:
    (rec,) = fit.servers(fit.HELD_OUT)
    return rec


def test_the_held_out_server_was_predicted_before_it_ran_within_15_percent() -> None:
    """plans/granite_tiny_h100_g.predicted-h100.json was committed with the Tiny-only fit,
    before the run: 5,809 tok/s at the cap (the seeds' constants had said 4,037) against 5,677
    steady. The fit has since taken Granite-Small's waves; today's planner is held below."""
    said = json.loads((fit.ROOT / "bench" / "real_sglang" / "plans" /
                       "granite_tiny_h100_g.predicted-h100.json").read_text())
    wave = next(p for p in said if p["server"] == "gt_eb_bf16" and p["run"] == "wave")
    assert wave["committed_tok_s_per_gpu"] == pytest.approx(
        fit.measured_rate(wave_of(held_out())), rel=0.15)


def test_the_held_out_pools_within_one_percent_and_the_cap_within_one() -> None:
    rec = held_out()
    plan = fit._plan(tuple(rec["flags"]))
    assert (plan.mamba_strategy, plan.slot_ratio) == ("extra_buffer", 5)
    assert abs(plan.max_running_requests - rec["max_running_requests"]) <= 1
    assert plan.max_total_num_tokens == pytest.approx(rec["max_total_num_tokens"], rel=0.01)
    assert plan.mamba_slots == pytest.approx(rec["max_mamba_cache_size"], rel=0.01)


def test_the_held_out_wave_and_long_mixed_outputs_within_15_percent() -> None:
    """Wave 5,809 planned against 5,677 steady; long mixed 5,780 against 5,411 while full."""
    rec = held_out()
    assert planned(rec, WAVE) == pytest.approx(fit.measured_rate(wave_of(rec)), rel=0.15)
    (run,) = [r for r in rec["runs"] if r["workload"] == "lognormal"]
    assert planned(rec, LONG) == pytest.approx(fit.full_batch_rate(rec, run), rel=0.15)
    for run in rec["runs"]:
        assert fit.replayed_rate(rec, run, None) == pytest.approx(fit.measured_rate(run),
                                                                  rel=0.15)


LONG_ALONE = (("2026-12-07-h100-s31", "gth"),)  # plans/granite_tiny_h100_h.json, after the fit


def long_alone() -> dict[str, Any]:
    (rec,) = fit.servers(LONG_ALONE)
    return rec


def test_a_second_held_out_server_pools_cap_exact_with_the_loaded_weights() -> None:
    """no_buffer fp32, overlap off, long mixed outputs only: the record said cap 154 priced
    with the shapes' 12.93 GiB; the log's 13.05 GiB gives the server's 461 slots and 153."""
    rec = long_alone()
    plan = fit._plan(tuple(rec["flags"]))
    assert plan.max_running_requests == rec["max_running_requests"] == 153
    assert plan.mamba_slots == rec["max_mamba_cache_size"]
    assert plan.max_total_num_tokens == pytest.approx(rec["max_total_num_tokens"], rel=0.01)


def test_a_second_held_out_servers_long_mixed_outputs_within_15_percent() -> None:
    """4,751 recorded before the run (the Tiny-only fit) against 5,430 generated while the
    batch was full (-12.5 %); today's planner, its fit taking Granite-Small's waves too, is
    held to the same bound, and its replay to the run's committed rate."""
    rec = long_alone()
    (run,) = rec["runs"]
    said = json.loads((fit.ROOT / "bench" / "real_sglang" / "plans" /
                       "granite_tiny_h100_h.predicted-h100.json").read_text())
    assert said[0]["committed_tok_s_per_gpu"] == pytest.approx(fit.full_batch_rate(rec, run),
                                                               rel=0.15)
    assert planned(rec, LONG) == pytest.approx(fit.full_batch_rate(rec, run), rel=0.15)
    assert fit.replayed_rate(rec, run, None) == pytest.approx(fit.measured_rate(run), rel=0.15)
