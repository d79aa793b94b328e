"""How well restart-on-regression tunes a simulated fleet, against an exhaustive sweep.

    python bench/tuning.py --scenario seed-000      (seed-004, canary-4, h200-27b)
    python bench/tuning.py --scenario long-mixed --seed 1

Runs the `generate` flow on simulated servers in the scenario's starting configuration,
lets the tuning loop work, then compares the final measured throughput with the best of an
exhaustive sweep over the policy's configuration space (evaluated with the simulator's own
pacing model, `predict_tok_s`). Ends with one JSON line: the gain, ratio_to_best, the
restarts (tuning cycles and server restarts), the lowest fleet throughput during a cycle as
a fraction of before (a canary keeps N−1 of N servers generating; a whole-fleet restart
stops all: 0), and the prediction error of the move that was kept.

`long-mixed` is the job the seeds describe: the Qwen3.6-27B shapes on H200s from the seeds'
extra_buffer start, answers of a reasoning model (lognormal lengths, mean 2,000 and p99
16,000 tokens, `--seed` picks the prompts and so the lengths). Its sweep scores every
configuration by the committed rate for that workload (the replay, infra/sim/predict.py),
not the decode rate, and its line adds `retractions` (the fleet's, from the server logs) and
`wrong_decisions`: canary verdicts the simulator's own steady rates contradict (a rollback of
a configuration that commits more than the one kept, a rollout of one that commits less).
With answers this long the last ledger reading covers the job's tail, so `ratio_to_best` and
`prediction_error` are judged against those steady rates too (bench/long_mixed.py), and the
line keeps the measured `final_tok_s` beside `final_true_tok_s`. 6,400 prompts at time scale
20, the restart's cost held in modeled time (`restart_overrides`): the tuner scores its whole
lever space with the answers' tail once 100 have come back (about a second a proposal,
bench/proposal_time.py), and one move must pay back over the work left.
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
    "canary-4": {  # seed-000's start on four servers: one canary, three roll one by one
        "model": "qwen3.6-27b-fp8", "gpu": "rtx-pro-6000", "version": "0.5.23",
        "time_scale": 10.0, "max_new_tokens": 2048, "prompts": 3000, "gpus": 4,
        "server": {"mamba_strategy": "extra_buffer"}, "concurrency": 32,
    },
    "h200-27b": {  # the real restart cycle's start (docs/REAL_SGLANG.md), H200-calibrated sim
        "model": str(ROOT / "tests" / "fixtures" / "models" / "qwen3.6-27b-text"),
        "weights_gib": 50.16, "gpu": "h200", "version": "0.5.17", "time_scale": 5.0,
        "max_new_tokens": 200, "prompts": 6000, "gpus": 2, "concurrency": None,
        "server": {"mamba_strategy": "extra_buffer", "mem_fraction_static": 0.9,
                   "mamba_full_memory_ratio": 0.3},
    },
    "long-mixed": {  # a reasoning model's training-data job (#26): long answers, spread wide
        "model": str(ROOT / "tests" / "fixtures" / "models" / "qwen3.6-27b-text"),
        "weights_gib": 50.16, "gpu": "h200", "version": "0.5.17", "time_scale": 20.0,
        "max_new_tokens": 32768, "prompts": 6400, "gpus": 2, "concurrency": None,
        "server": {"mamba_strategy": "extra_buffer"}, "prompt_bytes": 2048,
        "output_mean": 2000, "output_p99": 16000, "modeled_restart": True,
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

    model, gpu = model_profile(sc["model"], sc.get("weights_gib")), gpu_profile(sc["gpu"])
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


def model_figure(sc: dict, server: dict) -> float:
    """The roofline's tok/s per GPU for these flags (what `propose` compares)."""
    from infra.sglang.flags import ServerFlags
    from infra.sglang.memory import plan_memory
    from infra.sglang.planner import predict_tok_s
    from infra.sglang.profiles import gpu_profile, model_profile
    from infra.sglang.versions import parse_version

    model, gpu = model_profile(sc["model"], sc.get("weights_gib")), gpu_profile(sc["gpu"])
    flags = ServerFlags(**server)
    plan = plan_memory(model, gpu, flags, parse_version(sc["version"]))
    return predict_tok_s(model, gpu, flags, plan, 2048.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), default="seed-000")
    ap.add_argument("--gpus", type=int, default=None, help="default: the scenario's (or 2)")
    ap.add_argument("--canary-servers", type=int, default=None,
                    help="tuning.canary_servers (0: whole-fleet restarts; default 1)")
    ap.add_argument("--prompts", type=int, default=None,
                    help="job size (default: the scenario's); a restart has to pay for itself "
                         "over the work left, so a longer job lets smaller gains through")
    ap.add_argument("--seed", type=int, default=0,
                    help="varies the prompts, and with them the simulated answers' lengths")
    ap.add_argument("--time-scale", type=float, default=None,
                    help="sim.time_scale (default: the scenario's); lower = fewer requests per "
                         "wall second, so a small box's CPUs bias the readings less")
    args = ap.parse_args()
    sc = dict(SCENARIOS[args.scenario])
    if args.prompts:
        sc["prompts"] = args.prompts
    if args.time_scale:
        sc["time_scale"] = args.time_scale
    gpus = args.gpus or sc.get("gpus", 2)

    from infra.prefect_env import configure_local_prefect

    configure_local_prefect()
    from infra.prefect_api import use_temporary_api

    use_temporary_api()  # dies with the bench (a killed bench left Prefect's API running)
    from flows.generate import generate
    from tasks.tuning.ledger import TuningLedger

    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "p.jsonl"
        pad = "x" * sc.get("prompt_bytes", 0)
        seed = f"{args.seed} " if args.seed else ""
        prompts.write_text("".join(
            json.dumps({"id": f"b{i}", "prompt": f"bench {seed}{i} {pad}"}) + "\n"
            for i in range(sc["prompts"])))
        out = Path(tmp) / "out"
        overrides = {"sim.gpu": sc["gpu"], "sim.time_scale": sc["time_scale"],
                     **restart_overrides(sc), "sglang_version": sc["version"],
                     "client.concurrency_per_server": sc["concurrency"],
                     "sampling.max_new_tokens": sc["max_new_tokens"], "shard_size": 50,
                     "tuning.window_s": 4.0, "tuning.sample_interval_s": 0.5,
                     "base_port": 22000, **{f"server.{k}": v for k, v in sc["server"].items()}}
        if sc.get("weights_gib"):
            overrides.update(weights_gib=sc["weights_gib"], gpu_type=sc["gpu"])
        if args.canary_servers is not None:
            overrides["tuning.canary_servers"] = args.canary_servers
        if sc.get("output_mean"):
            overrides.update({"sim.output_mean_tokens": sc["output_mean"],
                              "sim.output_p99_tokens": sc["output_p99"]})
        summary = generate(prompts=str(prompts), output=str(out), model=sc["model"],
                           gpus=list(range(gpus)), overrides=overrides)
        entries = [e for e in TuningLedger(out / "tuning.jsonl").entries()
                   if e.outcome == "measured" and e.tok_s_per_gpu]
        line = result_line(args.scenario, gpus, sc, summary, entries)
        if sc.get("output_mean"):
            from long_mixed import judged_against_truth, retractions

            line.update(seed=args.seed, retractions=retractions(out / "servers"),
                        **judged_against_truth(sc, summary, line["best_sweep_tok_s"]))
    print(json.dumps(line))


# A restart's parts that are wall seconds, as the job at time scale 10 has them (a 3 s drain,
# a stop within 5 s): in modeled seconds, so they shrink as the time scale rises.
MODELED_DRAIN_S, MODELED_STOP_S = 30.0, 50.0


def restart_overrides(sc: dict) -> dict:
    """Settings for what a restart costs. A scenario with `modeled_restart` keeps that cost in
    modeled time — the server's start from its weights (the sim's model), the drain and the
    stop scaled by the time scale — so the job the tuner weighs a restart against keeps its
    shape when the time scale rises; the others start in a fixed 0.5 wall seconds."""
    if not sc.get("modeled_restart"):
        return {"sim.startup_s": 0.5}
    scale = sc["time_scale"]
    return {"tuning.drain_timeout_s": MODELED_DRAIN_S / scale,
            "stop_grace_s": MODELED_STOP_S / scale}


def result_line(name: str, gpus: int, sc: dict, summary: dict, entries: list) -> dict:
    """The benchmark's JSON line from the run's summary and tuning ledger."""
    start, final = entries[0].tok_s_per_gpu or 0.0, entries[-1].tok_s_per_gpu or 0.0
    if sc.get("output_mean"):
        from long_mixed import committed_sweep

        best_tok, best_flags = committed_sweep(sc)
    else:
        best_tok, best_flags = sweep(sc, 2048.0)
    cycles = summary["cycles"]
    overheads = [c["cycle_seconds"] - c["startup_seconds"] for c in cycles
                 if "cycle_seconds" in c and "startup_seconds" in c]
    canaries = [c["canary"] for c in cycles if c.get("canary")]
    fractions = [0.0 for c in cycles if not c.get("canary")] + [
        c["min_fleet_fraction"] for c in canaries if c["min_fleet_fraction"] is not None]
    # The kept move's predicted gain (the model's figure for it over its figure for the
    # start) against the gain the fleet then measured in steady state (final / start).
    gains = [c["predicted_gain"] for c in canaries if c["outcome"] == "rolled_out"
             and c["predicted_gain"]]
    fleet = [c for c in cycles if not c.get("canary") and c.get("predicted_tok_s_per_gpu")]
    if fleet:  # a whole-fleet restart: its figure over the model's figure for the start
        gains.append(fleet[-1]["predicted_tok_s_per_gpu"] / model_figure(sc, sc["server"]))
    errors = [abs(g / (final / start) - 1) for g in gains if start and final]
    return {
        "scenario": name, "gpus": gpus, "prompts": sc["prompts"],
        "start_tok_s": round(start, 1), "final_tok_s": round(final, 1),
        "gain": round(final / start, 2) if start else None,
        "best_sweep_tok_s": round(best_tok, 1),
        "ratio_to_best": round(final / best_tok, 3) if best_tok else None,
        "restarts": summary["restarts"],
        "server_restarts": sum(c["server_restarts"] for c in canaries)
        + gpus * sum(1 for c in cycles if not c.get("canary")),
        "min_fleet_fraction_during_cycle": round(min(fractions), 3) if fractions else None,
        "prediction_error": round(max(errors), 3) if errors else None,
        "canary_outcomes": [c["outcome"] for c in canaries],
        "cycle_overhead_s": round(statistics.median(overheads), 2) if overheads else None,
        "final_flags": summary["final_server_flags"], "best_sweep_flags": best_flags,
    }


if __name__ == "__main__":
    main()
