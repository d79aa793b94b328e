"""The planner's answers for a device plan, written down before the plan runs.

A model no calibration has seen is the test of the predictor only if its predictions are on
record before the measurement: for each server of a plan (bench/real_sglang/plans/*.json) this
runs `expansion plan --json` with the server's flags, once per workload of the plan (a fixed
wave at the cap; long mixed outputs by their mean and p99), and writes them next to the plan
as `<plan>.predicted-<gpu>.json` (one per GPU: the device lends whichever comes). The CI test
of the measured run then compares the planner of its day with the data, and these records
show what was said blind.

  python bench/real_sglang/predict_blind.py bench/real_sglang/plans/blind_granite_a.json \
      --weights-gib 60.03 --gpu h200 --sglang-version 0.5.17
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "bench" / "real_sglang" / "models"
# device.sh launches every server with dummy weights, which route a batch's tokens to fewer
# experts than trained ones: the record predicts the server that will run
DEVICE_LOAD = ("--load-format", "dummy")


def workload_args(run: dict[str, Any]) -> list[str]:
    """`expansion plan`'s workload options for one run of a plan."""
    if run["workload"] == "fixed":
        return ["--prompt-tokens", str(run["prompt_tokens"]),
                "--output-tokens", str(run["output_tokens"])]
    lo, hi = run["prompt_range"]
    return ["--prompt-tokens", str((lo + hi) // 2), "--output-tokens", str(run["mean"]),
            "--output-p99", str(run["p99"])]


def predict(server: dict[str, Any], run: dict[str, Any], args: argparse.Namespace,
            ) -> dict[str, Any]:
    config = MODELS / server["model"] / "config.json"
    argv = [sys.executable, "-m", "expansion.cli", "plan", "--model", str(config), "--gpu",
            args.gpu, "--sglang-version", args.sglang_version, "--weights-gib",
            str(args.weights_gib), *workload_args(run), "--json", *server["flags"],
            *DEVICE_LOAD]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    plan = json.loads(out)
    keep = ("mamba_strategy", "overlap_schedule", "mem_fraction_static", "mamba_slots",
            "slot_ratio", "max_total_num_tokens", "max_running_requests", "binding_limit",
            "graph_max_bs", "graphs_cover_cap", "tok_s_per_gpu", "committed_tok_s_per_gpu",
            "calibration")
    return {"server": server["name"], "run": run["name"], "argv": argv[3:],
            **{k: plan.get(k) for k in keep}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("plan", type=Path)
    parser.add_argument("--weights-gib", type=float, required=True)
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--sglang-version", default="0.5.17")
    args = parser.parse_args()
    servers = json.loads(args.plan.read_text())
    records = [predict(s, r, args) for s in servers for r in s["runs"]]
    out = args.plan.with_suffix(f".predicted-{args.gpu}.json")
    out.write_text(json.dumps(records, indent=1) + "\n")
    for r in records:
        print(f"{r['server']:>24} {r['run']:>10}: cap {r['max_running_requests']} "
              f"({r['binding_limit']}), {r['mamba_strategy']}, graphs cover "
              f"{r['graphs_cover_cap']}, committed {r['committed_tok_s_per_gpu']:,.0f} tok/s")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
