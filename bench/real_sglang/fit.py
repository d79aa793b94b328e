"""Fit the simulator's step-time model and live mamba accounting from real SGLang runs.

Reads the server logs that `calibrate.py` kept (one per mamba strategy), through the project's
own log parser, and derives from SGLang's Decode lines:

* the decode step time at each #running-req (running ÷ gen throughput, median of the lines
  logged while that many requests decoded), and a least-squares line step = a + b·running
  per strategy;
* the live mamba states per running request (`mamba num` ÷ #running-req);
* the roofline constants that reproduce those lines on this GPU (infra/sglang/roofline.py):
  bandwidth efficiency from the overlapped intercept, the no-overlap extra from the
  difference of intercepts, the per-request overhead from the slope left after the state and
  KV traffic, and the extra_buffer tracking traffic from the difference of slopes;
* the memory model's residual per configuration (slots, KV tokens, cap: model − measured).

Writes `infra/sglang/data/step_calibration.json` (what the simulator and planner read) and
prints a table for docs/SIMULATOR.md. Usage: `python bench/real_sglang/fit.py [DATA_DIR]`.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from infra.sglang.flags import ServerFlags
from infra.sglang.memory import per_slot_bytes, plan_memory
from infra.sglang.observe import parse_log
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.roofline import DEFAULT_CALIBRATION, StepCalibration, build_roofline
from infra.sglang.versions import parse_version

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "bench" / "real_sglang" / "data" / "2026-12-01-h200"
OUTPUT = ROOT / "infra" / "sglang" / "data" / "step_calibration.json"
MODEL = ROOT / "tests" / "fixtures" / "models" / "qwen3.6-27b-text"
WEIGHTS_GIB = 50.16  # "Load weight end ... mem usage=50.16 GB"
CONTEXT = 1024 + 128  # mean tokens in context over a level: 1,024 prompt + half of 256 out
CONFIGS = {  # log file → the flags it ran with (calibrate's configs_27b.json)
    "no_buffer": ServerFlags(mamba_strategy="no_buffer", mem_fraction_static=0.9,
                             disable_overlap_schedule=True),
    "extra_buffer": ServerFlags(mamba_strategy="extra_buffer", mem_fraction_static=0.9),
}


def decode_levels(log: Path) -> dict[int, dict[str, float]]:
    """Per #running-req: median step seconds and live mamba states per request."""
    by_running: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for rec in parse_log(log.read_text()):
        if rec["kind"] == "decode" and rec["running_req"] and rec["gen_throughput"]:
            by_running[int(rec["running_req"])].append(rec)
    levels = {}
    for n, recs in sorted(by_running.items()):
        if len(recs) < 5:  # ramp-up and tail lines: a few per level, not steady decode
            continue
        steps = [n / r["gen_throughput"] for r in recs]
        live = [r["mamba_num"] / n for r in recs if r["mamba_num"] is not None]
        levels[n] = {"step_s": statistics.median(steps), "lines": len(recs),
                     "live_states_per_request": statistics.median(live) if live else 0.0}
    return levels


def line_fit(points: dict[int, float]) -> tuple[float, float]:
    """Least squares step = a + b·n."""
    xs, ys = list(points), list(points.values())
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs)
    return my - b * mx, b


def prefill_tokens_per_s(log: Path) -> float:
    """SGLang's prefill rate: the median `input throughput` of a Prefill line of ≥ 4,096
    new tokens that follows another Prefill line, so that the interval it is measured over
    is the previous prefill's run. Only for a run without the overlap scheduler: with it,
    lines are stamped when a batch is scheduled, not when the GPU ran it."""
    recs = [r for r in parse_log(log.read_text()) if r["kind"] in ("prefill", "decode")]
    rates = [r["input_throughput"] for prev, r in itertools.pairwise(recs)
             if r["kind"] == prev["kind"] == "prefill" and (r["new_token"] or 0) >= 4096]
    return statistics.median(rates)


def fit_constants(lines: dict[str, tuple[float, float]],
                  prefill_rate: float) -> StepCalibration:
    """Roofline constants that reproduce both measured lines on the H200."""
    model = model_profile(str(MODEL), WEIGHTS_GIB)
    gpu = gpu_profile("h200")
    conv, ssm = per_slot_bytes(model, CONFIGS["no_buffer"])
    plan = plan_memory(model, gpu, CONFIGS["no_buffer"], parse_version("0.5.17"))
    weights = model.weights_gib * (1 << 30)
    a_overlap, b_overlap = lines["extra_buffer"]
    a_plain, b_plain = lines["no_buffer"]
    step_overhead = DEFAULT_CALIBRATION.step_overhead_s  # not separable from the intercept
    bandwidth = weights / ((a_overlap - step_overhead) * gpu.bandwidth_gbs * 1e9)
    effective_bps = gpu.bandwidth_gbs * 1e9 * bandwidth
    per_request_traffic = (2.0 * (conv + ssm) + CONTEXT * plan.kv_cell_bytes) / effective_bps
    tracking = max(0.0, (b_overlap - b_plain) * effective_bps / (conv + ssm))
    return StepCalibration(
        bandwidth_efficiency=round(bandwidth, 4),
        per_request_overhead_s=round(max(0.0, b_plain - per_request_traffic), 7),
        step_overhead_s=step_overhead,
        no_overlap_extra_s=round(max(0.0, a_plain - a_overlap), 5),
        extra_buffer_tracking_slots=round(tracking, 3),
        prefill_efficiency=round(prefill_rate * 2.0 * model.active_params_b * 1e9
                                 / (gpu.bf16_tflops * 1e12), 4),
    )


def predicted_step_s(strategy: str, n: int, cal: StepCalibration) -> float:
    model = model_profile(str(MODEL), WEIGHTS_GIB)
    gpu = gpu_profile("h200")
    plan = plan_memory(model, gpu, CONFIGS[strategy], parse_version("0.5.17"))
    return build_roofline(model, gpu, CONFIGS[strategy], plan, calibration=cal).decode_step_s(
        n, CONTEXT)


def memory_residuals(data: Path) -> list[dict[str, Any]]:
    """Model − measured for each configuration whose pools the logs show."""
    model = model_profile(str(MODEL), WEIGHTS_GIB)
    gpu = gpu_profile("h200")
    rows = []
    runs = {"no_buffer": CONFIGS["no_buffer"], "extra_buffer": CONFIGS["extra_buffer"],
            "no_buffer_r3.startup": CONFIGS["no_buffer"].model_copy(
                update={"mamba_full_memory_ratio": 3.0})}
    for name, flags in runs.items():
        measured: dict[str, Any] = {}
        for rec in parse_log((data / f"q27b_{name}.log").read_text()):
            if rec["kind"] == "startup":
                measured.update({k: v for k, v in rec.items() if v is not None})
        plan = plan_memory(model, gpu, flags, parse_version("0.5.17"))
        rows.append({
            "config": name.removesuffix(".startup"),
            "slots": (plan.mamba_slots, measured.get("max_mamba_cache_size")),
            "kv_tokens": (plan.max_total_num_tokens, measured.get("max_total_num_tokens")),
            "cap": (plan.max_running_requests, measured.get("max_running_requests")),
        })
    return rows


def main() -> None:
    data = Path(sys.argv[1]) if len(sys.argv) > 1 else DATA
    levels = {s: decode_levels(data / f"q27b_{s}.log") for s in CONFIGS}
    lines = {s: line_fit({n: v["step_s"] for n, v in lv.items()}) for s, lv in levels.items()}
    prefill_rate = prefill_tokens_per_s(data / "q27b_no_buffer.log")
    cal = fit_constants(lines, prefill_rate)
    print(f"prefill: {prefill_rate:.0f} tok/s (no_buffer, no overlap) → efficiency "
          f"{cal.prefill_efficiency}")
    print("running | strategy | measured ms | seed-fit model ms | H200-fit model ms | live/req")
    for strategy, lv in levels.items():
        for n, v in lv.items():
            print(f"{n:7d} | {strategy:12s} | {1000 * v['step_s']:11.2f} | "
                  f"{1000 * predicted_step_s(strategy, n, DEFAULT_CALIBRATION):17.2f} | "
                  f"{1000 * predicted_step_s(strategy, n, cal):17.2f} | "
                  f"{v['live_states_per_request']:.2f}")
    for row in memory_residuals(data):
        print(row)
    record = {"H200": {**cal.__dict__, "source": str(data.relative_to(ROOT)),
                       "sglang": "0.5.17", "model": "Qwen3.6-27B text shapes, bf16, dummy",
                       "context_tokens": CONTEXT, "prefill_tok_s": round(prefill_rate),
                       "lines_ms": {s: [round(1000 * a, 3), round(1000 * b, 4)]
                                    for s, (a, b) in lines.items()}}}
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {OUTPUT.relative_to(ROOT)}: {record}")


if __name__ == "__main__":
    main()
