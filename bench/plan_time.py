"""How long `expansion plan` takes, for every workload form, on one core; and the predictor
against the step-by-step replay it is held to.

    python bench/plan_time.py [--repeats 3] [--oracle]

1. `expansion plan` as a user runs it (a fresh process, bytecode cached, pinned to one core
   with `taskset` where there is one), for each model and workload form: median wall and
   user CPU of --repeats runs. #42's bar: ≤ 2 s for every form.
2. With --oracle: the p99 plan's alternatives computed in one process by the event replay
   and by the step-by-step one (`replay_requests_exact`), each from a cold cache: the ratio
   #42 asks ≥ 40× of. The step-by-step one takes minutes a model.
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = {  # name → (--model, --weights-gib or None)
    "Qwen3.6-27B": ("Qwen/Qwen3.6-27B", None),
    "Qwen3.6-35B-A3B": (str(ROOT / "bench/real_sglang/models/qwen3.6-35b-a3b-text"), "64.63"),
    "Nemotron-3-Nano-30B-A3B": (
        str(ROOT / "tests/fixtures/models/nemotron-3-nano-30b-a3b/config.json"), "58.9"),
    "Nemotron-3-Nano-4B": (str(ROOT / "bench/real_sglang/models/nemotron-3-nano-4b"), "7.47"),
    "Kimi-Linear-48B-A3B": (str(ROOT / "bench/real_sglang/models/kimi-linear-48b-a3b"),
                            "91.61"),
    # SGLang's request cap of 4,096 binds; the KV pool holds far fewer long answers
    "LFM2-8B-A1B": (str(ROOT / "bench/real_sglang/models/lfm2-8b-a1b"), "15.53"),
}
FORMS = {  # the workload forms of `expansion plan --help`
    "pools only": [],
    "--job": ["--job", "1000000", "--avg-output-tokens", "2000"],
    "1024 + 256": ["--prompt-tokens", "1024", "--output-tokens", "256"],
    "1024 + 2000": ["--prompt-tokens", "1024", "--output-tokens", "2000"],
    "1024 + 2000, p99 12000": ["--prompt-tokens", "1024", "--output-tokens", "2000",
                               "--output-p99", "12000"],
}
COMMON = ["--gpu", "h200", "--sglang-version", "0.5.17"]


def _argv(model: str, weights: str | None, form: list[str]) -> list[str]:
    extra = ["--weights-gib", weights] if weights else []
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    return [*pin, sys.executable, "-m", "expansion.cli", "plan", "--model", model, *extra,
            *COMMON, *form]


def time_cli(argv: list[str]) -> tuple[float, float]:
    """(wall, user CPU) seconds of one run in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    before = os.times()
    start = time.perf_counter()
    subprocess.run(argv, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = os.times()
    return wall, after.children_user - before.children_user


def cli_table(repeats: int) -> list[dict[str, Any]]:
    rows = []
    for name, (model, weights) in MODELS.items():
        time_cli(_argv(model, weights, []))  # fills the bytecode cache
        for form, args in FORMS.items():
            runs = [time_cli(_argv(model, weights, args)) for _ in range(repeats)]
            rows.append({"model": name, "form": form,
                         "wall_s": round(statistics.median(r[0] for r in runs), 2),
                         "user_s": round(statistics.median(r[1] for r in runs), 2)})
            print(f"{name:26} {form:24} {rows[-1]['wall_s']:6.2f} s wall "
                  f"{rows[-1]['user_s']:6.2f} s user", flush=True)
    return rows


def oracle_ratio(name: str) -> dict[str, Any]:
    """The p99 plan's alternatives by events and by steps, in this process, cold caches."""
    from infra.sglang.flags import ServerFlags
    from infra.sglang.planner import alternatives
    from infra.sglang.profiles import gpu_profile, model_profile
    from infra.sglang.versions import parse_version
    from infra.sim import predict, replay
    from infra.sim.replay_worker import WORKER

    model, weights = MODELS[name]
    prof = model_profile(model, float(weights) if weights else None)
    gpu, version = gpu_profile("h200"), parse_version("0.5.17")
    workload = predict.Workload(1024, 2000, 12000)
    out: dict[str, Any] = {"model": name}
    for label, fn in (("events", replay.replay_requests),
                      ("steps", replay.replay_requests_exact)):
        predict._RATES.clear()
        original = WORKER.replay_many
        WORKER.replay_many = lambda jobs, fn=fn: [fn(*job) for job in jobs]  # type: ignore
        try:
            start = time.process_time()
            rows = alternatives(prof, gpu, ServerFlags(), version, workload=workload)
            out[f"{label}_cpu_s"] = round(time.process_time() - start, 2)
        finally:
            WORKER.replay_many = original  # type: ignore[method-assign]
        out[f"{label}_committed"] = [round(r.committed_tok_s_per_gpu or 0.0) for r in rows]
        print(f"{name}: {label} {out[f'{label}_cpu_s']} s CPU", flush=True)
    out["ratio"] = round(out["steps_cpu_s"] / out["events_cpu_s"], 1)
    out["worst_disagreement"] = round(max(
        abs(e - s) / s for e, s in zip(out["events_committed"], out["steps_committed"],
                                       strict=True) if s), 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--oracle", action="store_true",
                        help="also time the step-by-step replay (minutes a model)")
    parser.add_argument("--skip-cli", action="store_true")
    args = parser.parse_args()
    result: dict[str, Any] = {}
    if not args.skip_cli:
        result["cli"] = cli_table(args.repeats)
        result["slowest_plan_s"] = max(r["wall_s"] for r in result["cli"])
    if args.oracle:
        result["oracle"] = [oracle_ratio(name) for name in MODELS]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
