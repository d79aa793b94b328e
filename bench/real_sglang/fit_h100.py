"""Fit the H100's decode step for a Mamba2 + MoE hybrid from real SGLang 0.5.17 runs.

Granite-4.0-H-Tiny's shapes (`GraniteMoeHybridForCausalLM`: 36 Mamba2 layers, 4 attention,
64 experts top-6 plus a shared expert; dummy weights) ran on an H100 at 32 to 302 running
requests under four configurations (default flags: extra_buffer with overlap; no_buffer fp32;
no_buffer bf16 with graphs to 320), `probe_long.py` driving each (bench/real_sglang/data/
2026-12-06-h100-s24, -s25); Granite-4.0-H-Small's (72 experts top-10, 8.8 B active) and
Nemotron-3-Nano-30B-A3B's (`NemotronHForCausalLM`: 23 Mamba2, 23 MoE layers of 128 experts
top-6, 6 attention; the triton MoE runner) four configurations each (-s33, -s34), both run
blind first. Until these runs the planner priced an H100 with the seeds' RTX PRO
6000 constants and its plans were 16-55 % off, low at small batches and high at large ones.

What is fitted, and on what:
* the prefill's share of peak bf16 FLOPs: SGLang's own prefill lines of full 8,192-token chunks;
* the decode step's constants (bandwidth share, fixed step cost with and without the overlap
  schedule, per-request cost per linear layer, the routed experts' share of peak, the
  extra_buffer tracking traffic, the dummy router's spread): a pattern search on the relative
  error of the step at every steady batch size of the fixed-length runs, each run's decode lines
  taken inside its own time window (a long-mixed run's lines carry prefills between them);
* nothing on committed tok/s: every run's committed rate (waves, batch levels, long mixed
  outputs) is then replayed through the simulator's scheduler with the fitted constants and
  compared — what tests/unit/test_real_granite_h100.py holds.

Usage: `python bench/real_sglang/fit_h100.py [--write]` (writes `H100 80GB/mamba2-moe` into
infra/sglang/data/step_calibration.json; without --write prints the fit and its residuals).
"""

from __future__ import annotations

import io
import itertools
import json
import math
import statistics
import sys
import tarfile
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from infra.sglang.flags import ServerFlags
from infra.sglang.memory import MemoryPlan, plan_memory
from infra.sglang.observe import parse_log
from infra.sglang.profiles import ModelProfile, gpu_profile, model_profile
from infra.sglang.roofline import CALIBRATION_FILE, StepCalibration, build_roofline
from infra.sim.replay import closed_loop, replay_scheduler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fit_moe import MODELS, V0517, active_params_range, server_flags, steady_wave_tok_s

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "bench" / "real_sglang" / "data"
# (folder, part): each part is one device call's tar of logs and results (probe_long.py)
PARTS = (("2026-12-06-h100-s24", "gtc"), ("2026-12-06-h100-s25", "gtd"),
         ("2026-12-06-h100-s25", "gte"), ("2026-12-06-h100-s26", "gtf"),
         ("2026-12-07-h100-s33", "gsw"), ("2026-12-07-h100-s33", "gsw2"),
         ("2026-12-07-h100-s34", "nhw2"))
# run after the fit, predicted before it ran (plans/granite_tiny_h100_g.predicted-h100.json):
# extra_buffer with bf16 SSM state, a configuration the fit never saw
HELD_OUT = (("2026-12-06-h100-s26", "gtg"),)
H100 = gpu_profile("h100")
# (GiB a step reads: the shapes' bf16 bytes, GiB the pools are sized after: what every log of
# the model says the load took, "Load weight end ... mem usage=")
WEIGHTS = {"granite-4.0-h-tiny": (12.93, 13.05), "granite-4.0-h-small": (60.03, 60.03),
           "nemotron-3-nano-30b-a3b": (58.82, 58.92)}
TINY = model_profile(str(MODELS / "granite-4.0-h-tiny"), WEIGHTS["granite-4.0-h-tiny"][0])
ENTRY = f"{H100.name}/{TINY.family}-moe"  # the key calibration_key looks up
MIN_LINES = 5
FULL_CHUNK = 8192  # the H100's chunked prefill size on this build: full chunks only


@dataclass(frozen=True)
class Level:
    """One steady decode batch size of one run: the median step its log reports there."""

    server: str
    run: str
    flags_argv: tuple[str, ...]
    running: int
    step_s: float
    context: float
    model: str = "granite-4.0-h-tiny"  # the models/ folder whose shapes ran


@cache
def step_model(name: str) -> ModelProfile:
    """The profile a step is priced with: the shapes' bytes."""
    return model_profile(str(MODELS / name), WEIGHTS[name][0])


@cache
def loaded_model(name: str) -> ModelProfile:
    """The profile the pools are planned with: the bytes the load took."""
    return replace(step_model(name), weights_gib=WEIGHTS[name][1])


def servers(parts: tuple[tuple[str, str], ...] = PARTS) -> list[dict[str, Any]]:
    """Every server that started, with its log text and its part's name."""
    out = []
    for folder, part in parts:
        with tarfile.open(DATA / folder / f"{part}.tar.gz") as tar:
            member = tar.extractfile(f"{part}/results.json")
            assert member is not None, f"{folder}/{part}.tar.gz holds no results.json"
            for rec in json.load(io.TextIOWrapper(member)):
                if "runs" not in rec:
                    continue
                log = tar.extractfile(f"{part}/{rec['name']}.log")
                assert log is not None, f"{part}: no log for {rec['name']}"
                out.append({**rec, "part": part, "log_text": log.read().decode()})
    return out


def _epoch(stamp: str) -> float:
    """A log line's timestamp (the device's clock is UTC) as the answers' epoch seconds."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(
        tzinfo=UTC).timestamp()


def run_levels(rec: dict[str, Any], run: dict[str, Any]) -> list[Level]:
    """The steady batch sizes of one run: decode lines logged between its first send and its
    last answer, grouped by #running-req (five lines at least)."""
    start = min(a["start"] for a in run["answers"])
    end = max(a["end"] for a in run["answers"])
    steps: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for line in parse_log(rec["log_text"]):
        if (line["kind"] != "decode" or not line["gen_throughput"] or line["running_req"] < 8
                or not line["timestamp"] or not start - 1 <= _epoch(line["timestamp"]) <= end):
            continue
        n = line["running_req"]
        steps[n].append((n / line["gen_throughput"], line["full_num_tokens"] / n))
    return [Level(rec["name"], run["name"], tuple(rec["flags"]), n,
                  statistics.median(s for s, _ in v), statistics.median(c for _, c in v),
                  rec["model"])
            for n, v in sorted(steps.items()) if len(v) >= MIN_LINES]


def fixed_levels(recs: list[dict[str, Any]]) -> list[Level]:
    return [lv for rec in recs for run in rec["runs"] if run["workload"] == "fixed"
            for lv in run_levels(rec, run)]


def step_levels(recs: list[dict[str, Any]]) -> list[Level]:
    """What the step is fitted on: the fixed runs' levels and the long-mixed runs' steps."""
    return fixed_levels(recs) + [lv for lv, _ in long_mixed_fits(recs)]


@cache
def _flags(argv: tuple[str, ...]) -> ServerFlags:
    return server_flags(list(argv))


@cache
def _plan(argv: tuple[str, ...], model: str = "granite-4.0-h-tiny") -> MemoryPlan:
    return plan_memory(loaded_model(model), H100, _flags(argv), V0517)


def predicted_step(level: Level, cal: StepCalibration) -> float:
    roof = build_roofline(step_model(level.model), H100, _flags(level.flags_argv),
                          _plan(level.flags_argv, level.model), calibration=cal)
    return roof.decode_step_s(level.running, level.context)


def step_error(cal: StepCalibration, found: list[Level]) -> float:
    """The root mean square of the modeled step's relative error over the levels (a worst
    case stalls a coordinate search on whichever level binds it)."""
    return math.sqrt(statistics.fmean(
        (predicted_step(lv, cal) / lv.step_s - 1) ** 2 for lv in found))


DECODE_LOG_INTERVAL = 20  # probe_long.py's servers log every 20th decode step


def long_mixed_fits(recs: list[dict[str, Any]]) -> list[tuple[Level, float]]:
    """Each long-mixed run's decode step and prefill batch cost, apart: there a lone answer's
    successor is prefilled between decode steps, so over the decode log's intervals at the
    run's usual batch size, interval = 20 steps + k prefill batches × a cost + their tokens ×
    a per-token cost (least squares). The step, at the run's median context, is a level of
    the step fit (the one that sees long contexts); the batch cost is the prefill's."""
    import numpy as np  # the fit's only use of it

    out = []
    for rec in recs:
        for run in rec["runs"]:
            if run["workload"] != "lognormal":
                continue
            rows = np.array(_intervals(rec, run), dtype=float)
            sizes, counts = np.unique(rows[:, 0], return_counts=True)
            usual = rows[rows[:, 0] == sizes[counts.argmax()]]
            design = np.column_stack([np.full(len(usual), float(DECODE_LOG_INTERVAL)),
                                      usual[:, 2], usual[:, 3]])
            (step, per_batch, _), *_ = np.linalg.lstsq(design, usual[:, 1], rcond=None)
            level = Level(rec["name"], run["name"], tuple(rec["flags"]), int(usual[0, 0]),
                          float(step), float(np.median(usual[:, 4])), rec["model"])
            out.append((level, float(per_batch)))
    return out


def full_batch_rate(rec: dict[str, Any], run: dict[str, Any]) -> float:
    """Generated tok/s while the batch was full (decode-log intervals at ≥ 95 % of the cap,
    the prefills between them included): a long run's steady rate, which a 180-s run's
    committed figure (ramp, and long answers unfinished at the end) is not."""
    full = [row for row in _intervals(rec, run) if row[0] >= 0.95 * rec["max_running_requests"]]
    return sum(DECODE_LOG_INTERVAL * row[0] for row in full) / sum(row[1] for row in full)


def prefill_batch_cost(recs: list[dict[str, Any]]) -> float:
    return round(statistics.fmean(cost for _, cost in long_mixed_fits(recs)), 4)


def _intervals(rec: dict[str, Any],
               run: dict[str, Any]) -> list[tuple[int, float, int, int, float]]:
    """(running, seconds, prefill batches, their new tokens, mean context) of each interval
    inside the run: a decode line's gen throughput is its 20 steps' tokens over the time
    since the last decode line, prefills between them included. An interval that began
    before the run (the run's first decode line, measured from the previous run's last: the
    server sat idle between them, 14 tok/s at a batch of 152) is not the run's."""
    start = min(a["start"] for a in run["answers"])
    end = max(a["end"] for a in run["answers"])
    out, pending = [], []
    for line in parse_log(rec["log_text"]):
        if not line["timestamp"] or not start - 1 <= _epoch(line["timestamp"]) <= end:
            continue
        if line["kind"] == "prefill":
            pending.append(int(line["new_token"] or 0))
        elif line["kind"] == "decode":
            n = line["running_req"]
            if line["gen_throughput"] and n >= 8:
                seconds = DECODE_LOG_INTERVAL * n / line["gen_throughput"]
                if _epoch(line["timestamp"]) - seconds < start - 1:
                    pending = []
                    continue
                out.append((n, seconds, len(pending), sum(pending),
                            line["full_num_tokens"] / n))
            pending = []
    return out


def prefill_efficiency(recs: list[dict[str, Any]], batch_s: float) -> float:
    """The per-token part of each full 8,192-token chunk's time (its new tokens over SGLang's
    input throughput, less the batch cost) as its model's FLOPs (2 × active parameters a
    token) over the H100's peak: the median of each model's lines, then the median of those
    (each model weighs the same, however many lines it logged, and no one model moves every
    other's prefill: Granite-Small's chunks reach 0.29 of peak, Tiny's 0.45, Nemotron-30B's
    0.96 — its dummy router sends a chunk's tokens to few experts, whose GEMMs are then large;
    their mean, 0.57, put Granite's replays up to 15 % high)."""
    shares: dict[str, list[float]] = defaultdict(list)
    for rec in recs:
        flops = 2.0 * step_model(rec["model"]).active_params_b * 1e9
        for line in parse_log(rec["log_text"]):
            if (line["kind"] == "prefill" and (line["new_token"] or 0) >= FULL_CHUNK
                    and line["input_throughput"]):
                chunk_s = line["new_token"] / line["input_throughput"]
                per_token_s = (chunk_s - batch_s) / FULL_CHUNK
                shares[rec["model"]].append(flops / per_token_s / (H100.bf16_tflops * 1e12))
    return round(statistics.median(statistics.median(v) for v in shares.values()), 4)


# The constants searched, each with its starting point, step and bounds.
SEARCHED: dict[str, tuple[float, float, float, float]] = {
    "bandwidth_efficiency": (0.8, 0.05, 0.3, 0.95),
    "step_overhead_s": (1.5e-3, 5e-4, 0.0, 1e-2),
    "no_overlap_extra_s": (1.0e-3, 5e-4, 0.0, 1e-2),
    "per_linear_layer_request_s": (1e-6, 5e-7, 0.0, 2e-5),
    "moe_efficiency": (0.2, 0.05, 0.01, 1.0),
    "extra_buffer_tracking_slots": (1.0, 0.5, 0.0, 8.0),
    "kv_read_factor": (1.0, 0.5, 1.0, 8.0),
    "state_passes": (2.0, 0.25, 1.0, 2.0),
}
# The dummy router's spread over each architecture's experts, searched: Granite's softmax top-k
# spreads wide; NemotronH's DeepSeek-V3 router (grouped sigmoid top-k with a correction bias,
# nemotron_h.py's NemotronHMoE) sends a random-weight batch to few experts, as Kimi-Linear's
# same router does on the H200 (0.02)
SPREADS = {"GraniteMoeHybridForCausalLM": (0.1, 0.2, 0.3, 0.5, 0.7, 1.0),
           "NemotronHForCausalLM": (0.02, 0.05, 0.1, 0.2)}


def pattern_search(cal: StepCalibration, found: list[Level], rounds: int = 12) -> StepCalibration:
    """Coordinate search: move each constant by its step while that lowers the error, halve
    the steps each round (the step model is smooth and monotone in each constant)."""
    steps = {k: v[1] for k, v in SEARCHED.items()}
    best = step_error(cal, found)
    for _ in range(rounds):
        for name, (_, _, low, high) in SEARCHED.items():
            for sign in (1.0, -1.0):
                while True:
                    value = min(high, max(low, getattr(cal, name) + sign * steps[name]))
                    trial = replace(cal, **{name: value})
                    error = step_error(trial, found)
                    if error >= best - 1e-9:
                        break
                    cal, best = trial, error
        steps = {k: v / 2 for k, v in steps.items()}
    return cal


def fit(recs: list[dict[str, Any]]) -> StepCalibration:
    """The graphed levels' constants (a search per dummy spread, the best kept), then the
    eager step's cost per layer: the median, over the levels past the decode graphs, of
    what they took beyond the graphed model."""
    found = step_levels(recs)
    graphed = [lv for lv in found if _graphed(lv)]
    batch_s = prefill_batch_cost(recs)
    searched: dict[str, Any] = {k: v[0] for k, v in SEARCHED.items()}
    start = replace(
        StepCalibration(bandwidth_efficiency=0.8, per_request_overhead_s=0.0,
                        step_overhead_s=0.0, no_overlap_extra_s=0.0,
                        extra_buffer_tracking_slots=0.0),
        prefill_efficiency=prefill_efficiency(recs, batch_s), prefill_batch_s=batch_s,
        **searched)
    combos = [tuple(zip(SPREADS, combo, strict=True))
              for combo in itertools.product(*SPREADS.values())]
    fits = [pattern_search(replace(start, dummy_routed_spread=spreads), graphed)
            for spreads in combos]
    cal = min(fits, key=lambda cal: step_error(cal, graphed))
    eager = statistics.median(
        (lv.step_s - predicted_step(lv, cal)) / step_model(lv.model).num_layers
        for lv in found if not _graphed(lv))
    return replace(cal, eager_layer_s=eager)


def _graphed(level: Level) -> bool:
    bound = _plan(level.flags_argv, level.model).graph_max_bs
    return bound <= 0 or level.running <= bound


def measured_rate(run: dict[str, Any]) -> float:
    """What the tests compare: a fixed run's steady rate (the answers sent after the first
    came back: a fresh server's first request compiles kernels for seconds), else the run's
    committed tok/s over its wall time."""
    if run["workload"] == "fixed":
        return steady_wave_tok_s(run)
    return float(run["committed_tok_s"])


def replayed_rate(rec: dict[str, Any], run: dict[str, Any], cal: StepCalibration | None) -> float:
    """The simulator's rate for exactly what the run sent: its rows, its clients, its
    deadline (`max_s`); steady for fixed lengths, committed over the whole loop otherwise."""
    flags = server_flags(rec["flags"])
    rows = [(int(p), int(o)) for p, o in run["requests_list"]]
    # a long run counts what was answered within its wall time (sends stop at max_s, answers
    # are awaited 30 s more); a fixed run answered everything
    deadline = float(run["wall_s"]) if run["workload"] == "lognormal" else float("inf")
    scheduler = replay_scheduler(step_model(rec["model"]), H100, flags, V0517, calibration=cal)
    result = closed_loop(scheduler, rows, int(run["concurrency"]), deadline)
    if run["workload"] == "fixed":
        return result.steady_tok_s or result.committed_tok_s
    return result.committed_tok_s


def entry(cal: StepCalibration) -> dict[str, Any]:
    sources = sorted({f"bench/real_sglang/data/{folder}" for folder, _ in PARTS})
    def rounded(value: Any) -> Any:
        return float(f"{value:.4g}") if isinstance(value, float) else value

    return {**{k: rounded(getattr(cal, k)) for k in StepCalibration.__dataclass_fields__},
            "dummy_routed_spread": dict(cal.dummy_routed_spread), "source": sources,
            "sglang": "0.5.17", "active_params_b": active_params_range(
                {name: step for name, (step, _) in WEIGHTS.items()}),
            "model": "Granite-4.0-H-Tiny and -Small shapes (GraniteMoeHybrid: Mamba2 + 64- and "
            "72-expert MoE), Nemotron-3-Nano-30B-A3B shapes (NemotronH: Mamba2 + 128-expert "
            "MoE, triton MoE runner), bf16, dummy"}


def main(argv: list[str]) -> int:
    recs = servers()
    cal = fit(recs)
    for lv in step_levels(recs):
        pred = predicted_step(lv, cal)
        print(f"{lv.server:22s} {lv.run:11s} running {lv.running:3d}  real "
              f"{lv.step_s * 1e3:6.2f} ms  model {pred * 1e3:6.2f} ms  {pred / lv.step_s - 1:+.3f}")
    for rec in recs:
        for run in rec["runs"]:
            real, shipped = measured_rate(run), replayed_rate(rec, run, None)
            after = replayed_rate(rec, run, cal)
            print(f"{rec['name']:22s} {run['name']:11s} real {real:7.0f}  shipped {shipped:7.0f}"
                  f" ({shipped / real - 1:+.3f})  fitted {after:7.0f} ({after / real - 1:+.3f})")
    print(json.dumps(entry(cal), indent=1))
    if "--write" in argv:
        table = json.loads(CALIBRATION_FILE.read_text())
        table[ENTRY] = entry(cal)
        CALIBRATION_FILE.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote {ENTRY} into {CALIBRATION_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
