"""Granite-4.0-H-Small's shapes (`GraniteMoeHybridForCausalLM`: Mamba2 + 72 experts top-10, 8.8 B
active) in five configurations on an H100, real SGLang 0.5.17, dummy weights
(bench/real_sglang/data/2026-12-07-h100-s33: `device.sh long
plans/blind_granite_small_h100_waves.json`, then `plans/granite_small_h100_long.json`), beside
the default flags' server of test_real_granite_small.py.

Blind, before the run (`plans/blind_granite_small_h100_waves.predicted-h100.json`), by a fit
on Granite-Tiny's shapes alone (1.5 B active): every pool exact, every wave 10-24 % high, three
of four outside the ±15 % the planner said. The H100's Mamba2 + MoE fit has since taken the four
waves (fit_h100.PARTS), and the planner now calls a model far from every size its entry was
fitted on extrapolated (±25 %). Held out of that fit: both long-mixed servers and the default."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from infra.sglang.memory import plan_memory
from infra.sim.predict import Workload

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "real_sglang"))
import fit_h100 as fit
from h100_runs import only_run, planned, servers

FOLDER = "2026-12-07-h100-s33"
WAVES = ((FOLDER, "gsw"), (FOLDER, "gsw2"))
LONG_RUNS = ((FOLDER, "gsl"), (FOLDER, "gsle"))
DEFAULT_FLAGS = (("2026-12-06-h100-s28", "gra"),)  # test_real_granite_small.py's server
WAVE = Workload(1024, 256)
LONG = Workload(1152, 2000, 12000)  # probe_long's long mixed: prompts 256-2,048, mean 2,000
BLIND = fit.ROOT / "bench" / "real_sglang" / "plans" / \
    "blind_granite_small_h100_waves.predicted-h100.json"


def blind_record(name: str) -> dict[str, Any]:
    return dict(next(p for p in json.loads(BLIND.read_text()) if p["server"] == name))


def test_every_server_answered_everything_it_was_sent() -> None:
    assert len(servers(WAVES + LONG_RUNS)) == 6
    for rec in servers(WAVES + LONG_RUNS):
        run = only_run(rec)
        assert run["errors"] == 0 and run["answered"] > 0
        if run["workload"] == "fixed":
            assert run["answered"] == run["requests_sent"]


@pytest.mark.parametrize("index", range(6))
def test_pools_cap_exact_slots_within_one_kv_within_1_percent(index: int) -> None:
    rec = servers(WAVES + LONG_RUNS)[index]
    plan = plan_memory(fit.loaded_model(rec["model"]), fit.H100, fit.server_flags(rec["flags"]),
                       fit.V0517)
    assert plan.max_running_requests == rec["max_running_requests"]
    assert abs(plan.mamba_slots - rec["max_mamba_cache_size"]) <= 1
    assert plan.max_total_num_tokens == pytest.approx(rec["max_total_num_tokens"], rel=0.01)


@pytest.mark.parametrize("index", range(4))
def test_the_blind_record_had_every_cap_and_every_wave_too_high(index: int) -> None:
    """What the Tiny-only fit said before the run: caps 28, 5, 10, 8 exact; waves 848, 275,
    418, 390 tok/s against 692, 221, 337, 355 steady (+23 %, +24 %, +24 %, +10 %)."""
    rec = servers(WAVES)[index]
    said = blind_record(rec["name"])
    assert said["max_running_requests"] == rec["max_running_requests"]
    error = said["committed_tok_s_per_gpu"] / fit.measured_rate(only_run(rec)) - 1
    assert 0.09 < error < 0.25


@pytest.mark.parametrize("index", range(4))
def test_each_wave_at_the_cap_within_15_percent_of_its_steady_rate(index: int) -> None:
    """Fitted on (the step at its batch): 738, 247, 367, 356 planned against 692, 221, 337,
    355 (+6.6 %, +11.8 %, +8.9 %, +0.3 %); the cap-5 server logged no steady step (under 8
    running), so its wave is a check of the prefill and the fixed step."""
    rec = servers(WAVES)[index]
    assert planned(rec, WAVE) == pytest.approx(fit.measured_rate(only_run(rec)), rel=0.15)


# Since the fit took Nemotron-30B's waves the cap-3 default's step is priced 9 % fast (12.7
# against 14.0 ms) and the cap-8 server's 1 % slow: the step's rise from 3 to 8 running (6.6 ms
# measured) is planned steeper than it ran, as if Small's dummy router spread wider than
# Tiny's, while one spread serves the architecture; the other three moves stay within 6 %
SMALL_SLOPE = pytest.mark.xfail(strict=True, reason=(
    "open: extra_buffer at fraction 0.93 (cap 8) over the defaults (cap 3) planned 1.61x, "
    "measured 1.80x: the joint Granite + NemotronH fit prices Small's cap-3 step 9 % fast"))


@pytest.mark.parametrize("index", [0, 1, 2, pytest.param(3, marks=SMALL_SLOPE)])
def test_every_moves_gain_over_the_default_flags_within_10_percent(index: int) -> None:
    """Over the default flags' server (extra_buffer, fraction 0.83: cap 3, 197 tok/s
    measured, 222 planned): 3.32× planned / 3.51× measured at cap 28, 1.11 / 1.12 (cap 5),
    1.66 / 1.71 (cap 10), 1.61 / 1.80 (extra_buffer at fraction 0.93, cap 8: open)."""
    (default,) = servers(DEFAULT_FLAGS)
    base_plan = planned(default, WAVE)
    base_real = fit.measured_rate(next(r for r in default["runs"] if r["name"] == "wave"))
    rec = servers(WAVES)[index]
    plan = planned(rec, WAVE) / base_plan
    real = fit.measured_rate(only_run(rec)) / base_real
    assert plan == pytest.approx(real, rel=0.10)


@pytest.mark.parametrize("index", range(2))
def test_held_out_long_mixed_outputs_within_15_percent_of_a_full_batch(index: int) -> None:
    """791 planned against 831 generated while the batch of 28 was full (-4.8 %); 364
    against 366 at cap 8 (-0.5 %). The runs' own committed rates (574, 290) count none of the
    long answers still running when the budget ran out: those are held to their replay."""
    rec = servers(LONG_RUNS)[index]
    run = only_run(rec)
    assert planned(rec, LONG) == pytest.approx(fit.full_batch_rate(rec, run), rel=0.15)
    assert fit.replayed_rate(rec, run, None) == pytest.approx(fit.measured_rate(run), rel=0.15)


def test_the_long_runs_and_the_default_are_not_in_the_fit() -> None:
    assert not set(LONG_RUNS + DEFAULT_FLAGS) & set(fit.PARTS) and set(WAVES) <= set(fit.PARTS)
