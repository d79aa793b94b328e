"""How well restart-on-regression tunes a simulated fleet, against an exhaustive sweep.

    python bench/tuning.py --scenario seed-000      (or seed-004)

Runs the `generate` flow on simulated servers in the scenario's starting configuration,
lets the tuning loop work, then compares the final measured throughput with the best of an
exhaustive sweep over the policy's configuration space (evaluated with the simulator's own
pacing model, `predict_tok_s`). Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCENARIOS: dict[str, dict[str, Any]] = {
    "seed-000": {
        "model": "qwen3.6-27b-fp8", "gpu": "rtx-pro-6000", "version": "0.5.23",
        "time_scale": 10.0, "max_new_tokens": 2048, "prompts": 2000,
        "server": {"mamba_strategy": "extra_buffer"}, "concurrency": 32,
    },
    "seed-004": {
        "model": "Qwen/Qwen3.6-27B", "gpu": "b200", "version": "main",
        "time_scale": 5.0, "max_new_tokens": 2048, "prompts": 1800,
        "server": {"mamba_strategy": "extra_buffer", "max_mamba_cache_size": 80,
                   "speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
                   "speculative_eagle_topk": 1}, "concurrency": 64,
    },
}


def sweep(sc: dict, avg_context: float) -> tuple[float, dict]:
    """Best predicted tok/s per GPU over the policy's levers (strategy × mem × mamba share)."""
    from infra.sglang.flags import ServerFlags
    from infra.sglang.memory import PoolsDoNotFit, plan_memory
    from infra.sglang.planner import MAX_MEM_FRACTION, predict_tok_s
    from infra.sglang.profiles import gpu_profile, model_profile
    from infra.sglang.versions import parse_version

    model, gpu = model_profile(sc["model"]), gpu_profile(sc["gpu"])
    version = parse_version(sc["version"])
    base = ServerFlags(**sc["server"])
    best: tuple[float, dict] = (0.0, {})
    slots = [None] if base.max_mamba_cache_size is None else [None, 80, 120, 160, 200, 240]
    for strategy, mem, ratio, mrr, mamba in itertools.product(
            ["extra_buffer", "no_buffer"], [None, 0.85, 0.88, 0.90, 0.93, MAX_MEM_FRACTION],
            [None, 1.35, 1.8, 2.7, 3.6, 5.4], [None, 128, 256], slots):
        try:
            flags = base.with_changes(mamba_strategy=strategy, mem_fraction_static=mem,
                                      mamba_full_memory_ratio=ratio, max_running_requests=mrr,
                                      max_mamba_cache_size=mamba)
            plan = plan_memory(model, gpu, flags, version)
        except (PoolsDoNotFit, ValueError):
            continue
        tok = predict_tok_s(model, gpu, flags, plan, avg_context)
        if tok > best[0]:
            best = (tok, flags.model_dump(exclude_none=True, exclude={"extra_args"}))
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), default="seed-000")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=None,
                    help="job size (default: the scenario's); a restart has to pay for itself "
                         "over the work left, so a longer job lets smaller gains through")
    args = ap.parse_args()
    sc = dict(SCENARIOS[args.scenario])
    if args.prompts:
        sc["prompts"] = args.prompts

    from infra.prefect_env import configure_local_prefect

    configure_local_prefect()
    from flows.generate import generate
    from tasks.tuning.ledger import TuningLedger

    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "p.jsonl"
        prompts.write_text("".join(json.dumps({"id": f"b{i}", "prompt": f"bench {i}"}) + "\n"
                                   for i in range(sc["prompts"])))
        out = Path(tmp) / "out"
        overrides = {"sim.gpu": sc["gpu"], "sim.time_scale": sc["time_scale"],
                     "sim.startup_s": 0.5, "sglang_version": sc["version"],
                     "client.concurrency_per_server": sc["concurrency"],
                     "sampling.max_new_tokens": sc["max_new_tokens"], "shard_size": 50,
                     "tuning.window_s": 4.0, "tuning.sample_interval_s": 0.5,
                     "base_port": 22000, **{f"server.{k}": v for k, v in sc["server"].items()}}
        summary = generate(prompts=str(prompts), output=str(out), model=sc["model"],
                           gpus=list(range(args.gpus)), overrides=overrides)
        entries = [e for e in TuningLedger(out / "tuning.jsonl").entries()
                   if e.outcome == "measured" and e.tok_s_per_gpu]
    start, final = entries[0].tok_s_per_gpu or 0.0, entries[-1].tok_s_per_gpu or 0.0
    best_tok, best_flags = sweep(sc, 2048.0)
    overheads = [c["cycle_seconds"] - c["startup_seconds"] for c in summary["cycles"]
                 if "cycle_seconds" in c]
    result = {
        "scenario": args.scenario, "gpus": args.gpus, "prompts": sc["prompts"],
        "start_tok_s": round(start, 1), "final_tok_s": round(final, 1),
        "gain": round(final / start, 2) if start else None,
        "best_sweep_tok_s": round(best_tok, 1),
        "ratio_to_best": round(final / best_tok, 3) if best_tok else None,
        "restarts": summary["restarts"],
        "cycle_overhead_s": round(statistics.median(overheads), 2) if overheads else None,
        "final_flags": summary["final_server_flags"], "best_sweep_flags": best_flags,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
