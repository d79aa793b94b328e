"""The real canary cycles on the H200 (docs/TUNING.md "Canary on real SGLang"), checked from
the data they left (bench/real_sglang/data/2026-12-01-h200-s5): three SGLang 0.5.17 servers
of the tiny Qwen3-Next sharing the GPU.

- rollback/: max_running_requests 32→120 with the pools kept. The model promised 1.52×; the
  canary measured 0.96× (batches above the CUDA-graph size of 32 run eager) and went back.
- rollout/: client concurrency 8 → cap + queue, no restart; the canary measured 3.22×.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from infra.settings import TuningSettings
from infra.sglang.flags import ServerFlags
from infra.sglang.memory import plan_memory
from infra.sglang.planner import predict_tok_s
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.versions import parse_version
from tasks.monitor import Sample
from tasks.tuning.canary import MIN_JUDGE_WINDOWS, group_rates, min_fleet_fraction

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "bench" / "real_sglang" / "data" / "2026-12-01-h200-s5"
TINY = ROOT / "tests" / "fixtures" / "models" / "tiny-qwen3-next"
WINDOW_S = 20.0  # bench/real_sglang/job_tiny_canary.toml


def ledger(run: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / run / "tuning.jsonl").read_text().splitlines()]


def samples(run: str) -> list[Sample]:
    frame = pl.read_parquet(DATA / run / "monitor.parquet")
    return [Sample(**row) for row in frame.iter_rows(named=True)]


def dead_spans(rows: list[Sample], server: str) -> list[tuple[float, float]]:
    """(first, last) tick of each run of samples where `server` did not answer."""
    spans: list[tuple[float, float]] = []
    for s in sorted((s for s in rows if s.server == server), key=lambda s: s.t):
        if s.alive:
            continue
        if spans and s.t - spans[-1][1] < 5.0:
            spans[-1] = (spans[-1][0], s.t)
        else:
            spans.append((s.t, s.t))
    return spans


def test_every_prompt_once_in_both_runs() -> None:
    for run, rows in (("rollback", 40_000), ("rollout", 20_000)):
        manifest = pl.read_ndjson(DATA / run / "manifest.jsonl")
        assert manifest["shard"].n_unique() == manifest.height
        assert manifest["rows"].sum() == rows and manifest["errors"].sum() == 0


def test_the_models_caps_for_both_configs() -> None:
    model, gpu, version = model_profile(str(TINY), 0.04), gpu_profile("h200"), parse_version(
        "0.5.17")
    start, candidate = (ServerFlags.model_validate(e["flags"]) for e in ledger("rollback")[:2])
    assert plan_memory(model, gpu, start, version).max_running_requests == 32
    assert plan_memory(model, gpu, candidate, version).max_running_requests == 120
    # What real SGLang ran: server-2 reached 120 running only as the canary, the others ≤ 32.
    peaks = pl.read_parquet(DATA / "rollback" / "monitor.parquet").group_by("server").agg(
        pl.col("running").max())
    assert dict(peaks.iter_rows()) == {"server-0": 32, "server-1": 32, "server-2": 120}


def test_rollback_verdict_follows_from_the_side_by_side_window() -> None:
    control, canary, after = ledger("rollback")
    assert (control["outcome"], canary["outcome"], after["outcome"]) == (
        "measured", "rolled_back", "measured")
    assert canary["flags"]["max_running_requests"] == 120
    model = model_profile(str(TINY), 0.04)
    start = ServerFlags.model_validate(control["flags"])
    baseline = predict_tok_s(model, gpu_profile("h200"), start, plan_memory(
        model, gpu_profile("h200"), start, parse_version("0.5.17")), 2048.0)
    # The run's model promised 1.52x for cap 120 with graphs kept at 32; the step model that
    # prices eager batches (eager_layer_s) predicts 1.06x for the same flags, within 12 % of
    # the 0.95x measured (and the policy now raises the graphs with such a cap).
    moved = ServerFlags.model_validate(canary["flags"])
    predicted_gain = predict_tok_s(model, gpu_profile("h200"), moved, plan_memory(
        model, gpu_profile("h200"), moved, parse_version("0.5.17")), 2048.0) / baseline
    measured_gain = canary["tok_s_per_gpu"] / control["tok_s_per_gpu"]
    assert 0.9 < measured_gain < 1.0 < TuningSettings().canary_min_gain
    assert predicted_gain == pytest.approx(measured_gain, rel=0.12)
    # The recorded rates are what the monitor's samples give over the canary's window.
    rows = samples("rollback")
    (out, back), (restore, _) = dead_spans(rows, "server-2")[:2]
    up = min(s.t for s in rows if s.server == "server-2" and s.t > back and s.alive)
    ours, theirs = group_rates(rows, up + WINDOW_S, up + MIN_JUDGE_WINDOWS * WINDOW_S + 2.0,
                               {"server-2"}, 1.0)
    assert ours is not None and theirs is not None
    assert abs(ours / canary["tok_s_per_gpu"] - 1) < 0.1
    assert abs(theirs / control["tok_s_per_gpu"] - 1) < 0.1
    # Two of three servers kept generating through both restarts.
    low = min_fleet_fraction(rows, out, restore + 60.0, WINDOW_S / 2)
    assert low is not None and 0.55 < low < 0.85, low  # 2 of 3 servers: about 2/3


def test_rollout_of_a_client_only_move_restarts_nothing() -> None:
    control, canary, final = ledger("rollout")
    assert canary["outcome"] == "measured" and canary["concurrency"] is None
    assert control["concurrency"] == 8
    assert canary["tok_s_per_gpu"] / control["tok_s_per_gpu"] > 3.0
    assert final["concurrency"] is None  # the job ended on the rolled-out limit
    # No server was restarted: the only samples without an answer are the fleet's final stop.
    rows = samples("rollout")
    end = max(s.t for s in rows)
    assert all(first > end - 10 for first, _ in dead_spans(rows, "server-2"))
