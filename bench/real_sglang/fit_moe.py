"""Fit the MoE hybrids' decode step on the H200 from real SGLang 0.5.17 runs (`probe_long.py`).

The step model (infra/sglang/roofline.py) reads the weights a step touches: the dense part
always, of the routed experts those its tokens are sent to (`MoeShape.touched_experts`), plus
the experts' grouped GEMMs at `moe_efficiency` of peak, the per-request state and KV traffic,
and a per-request cost per linear-attention layer. A batch above the decode CUDA-graph size
adds `eager_layer_s` per layer. Only the Qwen3.6-35B-A3B shapes are fitted (their step at 32,
96, 160, 192 and 312 running, graphed, and at 313 eager); Kimi-Linear-48B-A3B is held out
(its two levels are predicted, not fitted), except for its dummy-weight routing spread:
random router weights send Kimi's tokens to a handful of experts (about top-k of 256), the 35B's
to 0.8 of them — a property of `--load-format dummy`, used only for runs that say so; real
weights plan with the router spread over every expert.

Usage: `python bench/real_sglang/fit_moe.py [--write]` (writes `H200/gdn-moe` into
infra/sglang/data/step_calibration.json; without --write prints the fit and its residuals).
"""

from __future__ import annotations

import gzip
import itertools
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from infra.sglang.flag_parser import parse_server_flags
from infra.sglang.flags import ServerFlags
from infra.sglang.memory import plan_memory
from infra.sglang.observe import parse_log
from infra.sglang.profiles import ModelProfile, gpu_profile, model_profile
from infra.sglang.roofline import CALIBRATION_FILE, StepCalibration, build_roofline
from infra.sglang.versions import parse_version

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "bench" / "real_sglang" / "data" / "2026-12-03-h200-s16"
# servers run after the fit, never fitted on: a 35B configuration past the graphs, Kimi's
# no_buffer, NemotronH's extra_buffer (device.sh long plans/moe_s18_*.json)
HELD_OUT = ROOT / "bench" / "real_sglang" / "data" / "2026-12-04-h200-s18"
# Kimi-Linear at its fifth and sixth configurations: no_buffer at cap 256 with long mixed
# outputs (contexts to 9k), extra_buffer at cap 247 (device.sh long plans/moe_s19_*.json)
KIMI_S19 = ROOT / "bench" / "real_sglang" / "data" / "2026-12-04-h200-s19"
MODELS = ROOT / "bench" / "real_sglang" / "models"
WEIGHTS_GIB = {"qwen3.6-35b-a3b-text": 64.63, "kimi-linear-48b-a3b": 91.61,  # the logs' figures
               "nemotron-3-nano-4b": 7.47}
LAUNCH_ONLY = {"--skip-tokenizer-init"}
PROBE_FLAGS = ("--load-format", "dummy")  # calibrate.py's COMMON: every probe ran dummy weights
H200 = gpu_profile("h200")
V0517 = parse_version("0.5.17")
MIN_LINES = 5


@dataclass(frozen=True)
class Level:
    """One steady decode batch size of one server: the median step its log reports."""

    server: str
    model: ModelProfile
    flags: ServerFlags
    running: int
    step_s: float
    context: float


def server_flags(argv: list[str]) -> ServerFlags:
    """A probe's flags as the pipeline carries them (graph size, load format: extra_args)."""
    return parse_server_flags([f for f in argv if f not in LAUNCH_ONLY] + list(PROBE_FLAGS), V0517)


def records(folder: Path = DATA) -> list[dict[str, Any]]:
    """Every server the probes ran (a server that died has no cap), with its part's prefix."""
    out = []
    for path in sorted(folder.glob("moe*-results.json.gz")):
        part = path.name.split("-")[0]
        for rec in json.loads(gzip.decompress(path.read_bytes())):
            if "flags" in rec:
                out.append({**rec, "log": folder / f"{part}-{rec['name']}.log.gz"})
    return out


def levels(rec: dict[str, Any]) -> list[Level]:
    model = model_profile(str(MODELS / rec["model"]), WEIGHTS_GIB[rec["model"]])
    flags = server_flags(rec["flags"])
    steps: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for line in parse_log(gzip.decompress(rec["log"].read_bytes()).decode()):
        if line["kind"] == "decode" and line["gen_throughput"] and line["running_req"] > 8:
            n = line["running_req"]
            steps[n].append((n / line["gen_throughput"], line["full_num_tokens"] / n))
    return [Level(rec["name"], model, flags, n, statistics.median(s for s, _ in v),
                  statistics.median(c for _, c in v))
            for n, v in sorted(steps.items()) if len(v) >= MIN_LINES]


def steady_wave_tok_s(run: dict[str, Any]) -> float:
    """Committed tok/s of the answers sent after the first one came back: the first request
    on a fresh server compiles kernels (Kimi's first prefill took 38 s of a 45-s run)."""
    first = min(a["end"] for a in run["answers"])
    later = [a for a in run["answers"] if a["start"] >= first]
    return sum(a["completion_tokens"] for a in later) / (max(a["end"] for a in later) - first)


def predicted_step(level: Level, cal: StepCalibration) -> float:
    plan = plan_memory(level.model, H200, level.flags, V0517)
    return build_roofline(level.model, H200, level.flags, plan, calibration=cal).decode_step_s(
        level.running, level.context)


def worst(cal: StepCalibration, found: list[Level]) -> float:
    return max(abs(predicted_step(lv, cal) / lv.step_s - 1) for lv in found)


def prefill_efficiency(architecture: str) -> float:
    """Median input throughput of full-chunk prefill lines (8,192 new tokens) × FLOPs per
    token (2 × active parameters) ÷ the H200's peak."""
    rates, model = [], None
    for rec in records():
        model = model_profile(str(MODELS / rec["model"]), WEIGHTS_GIB[rec["model"]])
        if model.architecture != architecture:
            continue
        rates += [line["input_throughput"] for line in parse_log(
            gzip.decompress(rec["log"].read_bytes()).decode())
            if line["kind"] == "prefill" and (line["new_token"] or 0) >= 8192]
        flops = 2.0 * model.active_params_b * 1e9
    return round(statistics.median(rates) * flops / (H200.bf16_tflops * 1e12), 4)


def fit(base: StepCalibration) -> StepCalibration:
    """Grid search on the 35B's levels (max relative error), then Kimi's spread alone."""
    base = replace(base, prefill_efficiency=prefill_efficiency("Qwen3_5MoeForCausalLM"))
    all_levels = [lv for rec in records() for lv in levels(rec)]
    qwen = [lv for lv in all_levels if lv.model.architecture == "Qwen3_5MoeForCausalLM"]
    kimi = [lv for lv in all_levels if lv.model.architecture == "KimiLinearForCausalLM"]
    graphed = [lv for lv in qwen if lv.running <= 256 or "--cuda-graph-max-bs" in
               lv.flags.extra_args]
    grid = itertools.product((0.05, 0.1, 0.15, 0.2, 0.3, 0.5), (0.6, 0.7, 0.8, 0.9, 1.0))
    eff, spread = min(grid, key=lambda g: worst(
        _with(base, g[0], 0.0, {"Qwen3_5MoeForCausalLM": g[1]}), graphed))
    spreads = {"Qwen3_5MoeForCausalLM": spread}
    graphed_cal = _with(base, eff, 0.0, spreads)
    eager = statistics.median(
        (lv.step_s - predicted_step(lv, graphed_cal)) / lv.model.num_layers
        for lv in qwen if lv not in graphed)
    kimi_spread = min((0.02, 0.05, 0.1, 0.2, 0.5, 1.0), key=lambda s: worst(
        _with(base, eff, eager, {**spreads, "KimiLinearForCausalLM": s}), kimi))
    cal = _with(base, eff, round(eager, 6), {**spreads, "KimiLinearForCausalLM": kimi_spread})
    return fit_mla(cal)


def fit_mla(cal: StepCalibration) -> StepCalibration:
    """MLA attention's share of peak (`mla_attention_efficiency`): the grid value whose
    median error over every Kimi decode level of every session is nearest zero. Long
    contexts are where it shows (the s19 long-mixed tail: 26-60 running at 4-9k tokens);
    a median, not a worst case, because decode lines of a full batch in a long-mixed run
    carry the prefills between them (255 running: 36 ms against 22 in the wave)."""
    kimi = [lv for folder in (DATA, HELD_OUT, KIMI_S19) for rec in records(folder)
            if rec["model"] == "kimi-linear-48b-a3b" for lv in levels(rec)]

    def bias(eff: float) -> float:
        return abs(statistics.median(
            predicted_step(lv, replace(cal, mla_attention_efficiency=eff)) / lv.step_s - 1
            for lv in kimi))

    return replace(cal, mla_attention_efficiency=min(
        (round(0.02 + 0.005 * i, 3) for i in range(21)), key=bias))


def _with(base: StepCalibration, eff: float, eager: float,
          spreads: dict[str, float]) -> StepCalibration:
    """The GPU's constants with the per-request cost moved onto the linear layers (the
    27B's 48 layers: 52.6 µs a request), the MoE terms and the dummy spreads."""
    return replace(base, per_request_overhead_s=0.0,
                   per_linear_layer_request_s=round(base.per_request_overhead_s / 48, 10),
                   moe_efficiency=eff, eager_layer_s=eager,
                   dummy_routed_spread=tuple(sorted(spreads.items())))


def active_params_range(weights_gib: dict[str, float]) -> list[float]:
    """The fewest and most active parameters (billions) of the models a fit saw (models/
    folder → the GiB of weights its profile is read with): what the planner reads to call a
    model far from all of them extrapolated (calibration_note.fitted_sizes)."""
    sizes = [model_profile(str(MODELS / name), gib).active_params_b
             for name, gib in weights_gib.items()]
    return [round(min(sizes), 2), round(max(sizes), 2)]


def main(argv: list[str]) -> int:
    table = json.loads(CALIBRATION_FILE.read_text())
    base = StepCalibration(**{k: v for k, v in table["H200"].items()
                              if k in StepCalibration.__dataclass_fields__})
    cal = fit(base)
    for rec in records():
        for lv in levels(rec):
            pred = predicted_step(lv, cal)
            print(f"{lv.server:20s} running {lv.running:3d}  real {lv.step_s * 1e3:6.2f} ms  "
                  f"model {pred * 1e3:6.2f} ms  {pred / lv.step_s - 1:+.3f}")
    entry = {**{k: getattr(cal, k) for k in StepCalibration.__dataclass_fields__},
             "dummy_routed_spread": dict(cal.dummy_routed_spread),
             "source": str(DATA.relative_to(ROOT)), "sglang": "0.5.17",
             "active_params_b": active_params_range(
                 {rec["model"]: WEIGHTS_GIB[rec["model"]] for rec in records()}),
             "model": "Qwen3.6-35B-A3B text shapes (fitted), Kimi-Linear-48B-A3B (its dummy "
                      "spread; MLA attention on every session's levels), bf16, dummy"}
    if "--write" in argv:
        table["H200/gdn-moe"] = entry
        CALIBRATION_FILE.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote H200/gdn-moe into {CALIBRATION_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
