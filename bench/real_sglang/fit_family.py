"""Fit the step-time constants of one architecture family from real SGLang runs on one GPU.

The H200's constants (`fit.py`) come from the Qwen3.6-27B shapes, a GDN hybrid. A mamba2
hybrid (NemotronH) runs other kernels: on the H200 its prefill reached 44.5k tok/s where the
27B's efficiency predicts 82k, and the simulator's replay was 51 % fast at the cap. This fit
reads the logs of `probe_long.py` runs of one family (two or more configurations at different
caps) through the project's own log parser, and derives

* `prefill_efficiency`: the median input throughput of full-chunk prefill lines
  (≥ 4,096 new tokens) × FLOPs per token ÷ the GPU's peak;
* `per_request_overhead_s` and `step_overhead_s`: a least-squares line through the median
  decode step (running ÷ gen throughput) at each steady #running-req, less the roofline's
  weight, state and KV traffic at the context the lines report (#token ÷ running).

NemotronH under 0.5.17 always decodes with the overlap scheduler off (no_buffer demands it;
extra_buffer is refused for it), so its fixed step cost is one constant: `no_overlap_extra_s`
is 0 and `step_overhead_s` holds both. Writes the entry `GPU/family` into
`infra/sglang/data/step_calibration.json`. Usage:
`python bench/real_sglang/fit_family.py mamba2 LOG.gz:FLAGS… [--write]`; with no arguments it
refits the committed NemotronH-4B runs: session 10's cap-237 run (its client pooled, 16 workers
an httpx client; session 8's one client idled the server between waves) and session 8's ratio-0.3
run.
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

from infra.sglang.flag_parser import parse_server_flags
from infra.sglang.hf_config import profile_from_hf_config
from infra.sglang.memory import plan_memory
from infra.sglang.observe import parse_log
from infra.sglang.profiles import GpuProfile, ModelProfile, gpu_profile
from infra.sglang.roofline import CALIBRATION_FILE, build_roofline, calibration_for
from infra.sglang.versions import parse_version

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "bench" / "real_sglang" / "data" / "2026-12-02-h200-s8"
DATA_S10 = DATA.with_name("2026-12-02-h200-s10")
NEMOTRON_4B = ROOT / "bench" / "real_sglang" / "models" / "nemotron-3-nano-4b" / "config.json"
NEMOTRON_WEIGHTS_GIB = 7.47  # "Load weight end ... mem usage=7.47 GB"
NO_BUFFER = ["--mem-fraction-static", "0.9", "--mamba-radix-cache-strategy", "no_buffer",
             "--disable-overlap-schedule"]
NEMOTRON_RUNS = {  # log → the flags it ran with (plans/cal_nh4b_s10.json, cal_nemotron4b.json)
    DATA_S10 / "nh4b_s10-nh4b_nb.log.gz": NO_BUFFER,
    DATA / "calnh4b-nh4b_nb_r03.log.gz": [*NO_BUFFER, "--mamba-full-memory-ratio", "0.3"],
}
MIN_LINES = 5  # a level logged fewer times is the ramp or the tail, not steady decode


def read_log(path: Path) -> list[dict[str, Any]]:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return parse_log(raw.decode())


def prefill_tok_s(records: list[dict[str, Any]]) -> float:
    full = [r["input_throughput"] for r in records if r["kind"] == "prefill"
            and (r["new_token"] or 0) >= 4096 and r["input_throughput"]]
    return statistics.median(full)


def decode_levels(records: list[dict[str, Any]]) -> dict[int, tuple[float, float]]:
    """#running-req → (median step seconds, median tokens in context per request)."""
    by: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r["kind"] == "decode" and r["running_req"] and r["gen_throughput"]:
            by[int(r["running_req"])].append(r)
    return {n: (statistics.median(n / r["gen_throughput"] for r in rs),
                statistics.median((r["num_tokens"] or 0) / n for r in rs))
            for n, rs in by.items() if len(rs) >= MIN_LINES}


def fit(model: ModelProfile, gpu: GpuProfile, runs: dict[Path, list[str]]) -> dict[str, Any]:
    version = parse_version("0.5.17")
    base = calibration_for(gpu)
    points: list[tuple[int, float]] = []  # (running, step − traffic)
    prefill: list[float] = []
    for log, argv in runs.items():
        records = read_log(log)
        flags = parse_server_flags(argv)
        plan = plan_memory(model, gpu, flags, version)
        roof = build_roofline(model, gpu, flags, plan, calibration=replace(
            base, per_request_overhead_s=0.0, step_overhead_s=0.0, no_overlap_extra_s=0.0))
        prefill.append(prefill_tok_s(records))
        for n, (step, ctx) in decode_levels(records).items():
            points.append((n, step - roof.decode_step_s(n, ctx)))
    if len({n for n, _ in points}) < 2:
        raise SystemExit("fit_family: need steady decode at two #running-req levels at least")
    xs, ys = [float(n) for n, _ in points], [y for _, y in points]
    slope, intercept = statistics.linear_regression(xs, ys)
    flops = 2.0 * model.active_params_b * 1e9
    return {"bandwidth_efficiency": base.bandwidth_efficiency,
            "per_request_overhead_s": round(slope, 9), "step_overhead_s": round(intercept, 6),
            "no_overlap_extra_s": 0.0, "extra_buffer_tracking_slots": 0.0,
            "prefill_efficiency": round(statistics.median(prefill) * flops
                                        / (gpu.bf16_tflops * 1e12), 4),
            "prefill_tok_s": round(statistics.median(prefill)),
            "levels": sorted({n for n, _ in points})}


def main(argv: list[str]) -> None:
    write = "--write" in argv
    model = profile_from_hf_config(NEMOTRON_4B, NEMOTRON_WEIGHTS_GIB)
    gpu = gpu_profile("h200")
    values = fit(model, gpu, NEMOTRON_RUNS)
    sources = sorted({str(log.parent.relative_to(ROOT)) for log in NEMOTRON_RUNS})
    entry = {**values, "source": ", ".join(sources), "sglang": "0.5.17",
             "model": "NVIDIA-Nemotron-3-Nano-4B shapes, bf16, dummy; overlap off"}
    print(json.dumps(entry, indent=1))
    if write:
        table = json.loads(CALIBRATION_FILE.read_text())
        table[f"{gpu.name}/{model.family}"] = entry
        CALIBRATION_FILE.write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
