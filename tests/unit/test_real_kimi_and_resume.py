"""Kimi-Linear-48B-A3B at its fifth and sixth configurations, and the tuner's run from the
35B-A3B's default flags again, on real SGLang 0.5.17 (H200, dummy weights;
bench/real_sglang/data/2026-12-04-h200-s19):
- `plans/moe_s19_kimi.json`: no_buffer, bf16 SSM state, ratio 3, cap 256 — a wave, 64 and
  160 running, and 600 long mixed outputs (lognormal mean 2,000, p99 12,000, to 12,288);
- `plans/moe_s19_b.json`: extra_buffer, bf16, ratio 3 (cap 247 = 1,239 slots / 5);
- `device.sh warm35`, then `device.sh tune 10000 540`: `expansion run` on job_35b_tune.toml,
  cut by the call's time bound after 6,250 of 10,000 rows. The machine was gone before the
  resume could run; what a resume would start from is checked here on the ledger it left.
MLA attention's share of peak is fitted on every Kimi decode level (fit_moe.fit_mla); the
pools, the waves of servers it did not change and the 35B run are not fitted."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from flows.generate import job_settings
from infra.sglang.memory import plan_memory
from infra.sglang.profiles import model_profile
from infra.sim.predict import Workload, committed_tok_s
from infra.sim.replay import replay_requests
from tasks.tuning.ledger import TuningLedger, config_key

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "real_sglang"))
from fit_moe import (
    DATA,
    H200,
    HELD_OUT,
    KIMI_S19,
    MODELS,
    ROOT,
    V0517,
    WEIGHTS_GIB,
    records,
    server_flags,
    steady_wave_tok_s,
)

S19 = {rec["name"]: rec for rec in records(KIMI_S19)}
KIMI = {rec["name"]: rec for folder in (DATA, HELD_OUT, KIMI_S19) for rec in records(folder)
        if rec["model"] == "kimi-linear-48b-a3b"}
TUNE = KIMI_S19 / "tune35"
SWEEP_BEST = 4809.0  # the 35B's five-server sweep: bf16 + graphs 320 (test_real_unseen.py)
LONG_OFF = ("open: Kimi's long mixed run committed 5,018 tok/s where the replay says 5,804 "
            "(+15.7 %): its full-batch decode at 2-3k tokens of context is slower than the "
            "MLA term fitted on its whole range")


def setup(rec: dict[str, Any]) -> tuple[Any, Any]:
    return (model_profile(str(MODELS / rec["model"]), WEIGHTS_GIB[rec["model"]]),
            server_flags(rec["flags"]))


def test_kimi_ran_six_configurations_five_of_them_served() -> None:
    assert set(S19) == {"kimi_nb_bf16_c256", "kimi_eb_bf16"}
    served = {n for n, r in KIMI.items() if "error" not in r}
    assert served == {"kimi_default", "kimi_nb", "kimi_nb_bf16_g320", "kimi_nb_bf16_c256",
                      "kimi_eb_bf16"}  # kimi_nb_bf16 (cap 320, graphs 256) died eager


@pytest.mark.parametrize("name", sorted(S19))
def test_pools_are_exact(name: str) -> None:
    model, flags = setup(S19[name])
    plan = plan_memory(model, H200, flags, V0517)
    rec = S19[name]
    assert plan.max_running_requests == rec["max_running_requests"]
    assert abs(plan.mamba_slots - rec["max_mamba_cache_size"]) <= 1
    assert plan.max_total_num_tokens == pytest.approx(rec["max_total_num_tokens"], rel=0.01)
    if name == "kimi_eb_bf16":
        assert (plan.mamba_strategy, plan.slot_ratio, plan.overlap_schedule) == (
            "extra_buffer", 5, True)


@pytest.mark.parametrize("name", sorted(n for n, r in KIMI.items() if "error" not in r))
def test_every_kimi_wave_is_planned_within_15_percent(name: str) -> None:
    """Overlap on and off, extra_buffer and no_buffer, fp32 and bf16 state, caps 80-320."""
    model, flags = setup(KIMI[name])
    wave = next(r for r in KIMI[name]["runs"] if r["name"] == "wave")
    predicted = committed_tok_s(model, H200, flags, V0517, Workload(1024, 256))
    assert predicted == pytest.approx(steady_wave_tok_s(wave), rel=0.15)


@pytest.mark.xfail(reason=LONG_OFF, strict=True)
def test_kimis_long_mixed_run_is_replayed_within_15_percent() -> None:
    rec = S19["kimi_nb_bf16_c256"]
    model, flags = setup(rec)
    run = next(r for r in rec["runs"] if r["name"] == "long-mixed")
    sim = replay_requests(model, H200, flags, V0517, [tuple(r) for r in run["requests_list"]],
                          run["concurrency"], max_s=run["wall_s"])
    assert sim.committed_tok_s == pytest.approx(run["committed_tok_s"], rel=0.15)


def ledger() -> TuningLedger:
    return TuningLedger(TUNE / "tuning.jsonl")


def test_the_move_is_on_record_before_its_epoch_ends() -> None:
    """The run was cut in epoch 2: the ledger holds the default's measure and the move."""
    first, moved = ledger().entries()
    assert (first.outcome, moved.outcome, moved.epoch) == ("measured", "started", 2)
    flags = ledger().flags_of(moved)
    assert (flags.mamba_ssm_dtype, flags.graph_max_bs) == ("bfloat16", 313)


def test_the_same_command_again_resumes_on_the_move(tmp_path: Path) -> None:
    """What `expansion run --config job_35b_tune.toml` builds, read against that ledger."""
    settings = job_settings(str(tmp_path / "p.jsonl"), str(tmp_path / "out"),
                            config_file=str(ROOT / "bench/real_sglang/job_35b_tune.toml"))
    point = ledger().resume_point(settings.server, settings.client.concurrency_per_server)
    assert point is not None and point.outcome == "started"
    assert ledger().flags_of(point).mamba_ssm_dtype == "bfloat16" and point.concurrency is None
    assert config_key(settings.server, None) == ledger().entries()[0].fingerprint
    assert ledger().last_epoch() + 1 == 3 and ledger().moves() == 1


def epoch_two_rate() -> float:
    """Committed tok/s of the moved server's shards (the first after the restart opens)."""
    shards = sorted((json.loads(line) for line in (TUNE / "manifest.jsonl").read_text()
                     .splitlines()), key=lambda r: r["committed_at"])
    moved = [s for s in shards if s["committed_at"] - shards[0]["committed_at"] > 100]
    return (sum(s["output_tokens"] for s in moved[1:])
            / (moved[-1]["committed_at"] - moved[0]["committed_at"]))


def test_the_move_kept_beats_the_default_and_is_the_sweeps_best() -> None:
    """Default measured 4,448 in its window; the move predicted 5,238, committed 5,157
    (1.16x), above the sweep's best steady wave (4,809) — the tuner's configuration is that
    best one (the same flags, cap 312)."""
    first, moved = ledger().entries()
    rate = epoch_two_rate()
    assert rate > (first.tok_s_per_gpu or 0.0)  # never kept below the one it replaced
    assert rate >= 0.95 * SWEEP_BEST
    assert rate == pytest.approx(moved.predicted_tok_s_per_gpu or 0.0, rel=0.10)
    rows = json.loads((TUNE / "tune35-rows.json").read_text())
    assert rows["rows"] == rows["unique_ids"] == 6250
