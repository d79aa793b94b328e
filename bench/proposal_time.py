"""How long the tuner takes to propose a move with the answers' tail, over its whole lever space.

    taskset -c 0 python bench/proposal_time.py [--repeats 3]

Each case is one `propose` call as the tuner makes it mid-job (a mamba-bound diagnosis, the
measured workload with its p99), timed from a fresh process's first call (the replays it
needs are not cached yet: that is the cost a check pays) — the median of `--repeats` fresh
processes, wall seconds (the replays run in the replay worker, so the parent's CPU alone
would miss them). Prints one JSON line per case: wall seconds, candidates scored, the pick.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tasks.tuning.lever_space import MTP  # noqa: E402

MODELS = ROOT / "tests" / "fixtures" / "models"
REAL = ROOT / "bench" / "real_sglang" / "models"

CASES = {  # name: (model, weights GiB, start flags, (prompt, mean output, p99))
    "27b-long-mixed": (str(MODELS / "qwen3.6-27b-text"), 50.16,
                       {"mamba_strategy": "extra_buffer"}, (520, 1700, 14000)),
    "27b-long-mixed-mtp": (str(MODELS / "qwen3.6-27b-text"), 50.16,
                           {"mamba_strategy": "extra_buffer", **MTP}, (520, 1700, 14000)),
    "35b-a3b-p99": (str(REAL / "qwen3.6-35b-a3b-text"), 64.63, {}, (1024, 2000, 12000)),
}


def one(case: str) -> dict[str, object]:
    """One proposal in this process (called in a child)."""
    import time

    sys.path.insert(0, str(ROOT))
    from infra.sglang.flags import ServerFlags
    from infra.sglang.hardware import Hardware
    from infra.sglang.planner import Demand
    from infra.sglang.profiles import gpu_profile, model_profile
    from infra.sglang.versions import parse_version
    from infra.sim.predict import Workload
    from tasks.tuning.diagnosis import Diagnosis
    from tasks.tuning.policy import Search, propose

    model, weights, start, (prompt, mean, p99) = CASES[case]
    assert isinstance(start, dict)
    hw = Hardware(model_profile(model, weights), gpu_profile("h200"), parse_version("0.5.17"))
    search = Search(hw, demand=Demand(workload=Workload(prompt, mean, p99)), min_gain=1.0)
    began = time.perf_counter()
    proposal = propose(Diagnosis("mamba-bound", "", 1.0), ServerFlags(**start), None, search)
    wall = time.perf_counter() - began
    reason = proposal.reason if proposal else ""
    scored = reason.rsplit("best of ", 1)[-1].split(" moves", 1)[0] if proposal else "0"
    replayed = reason.rsplit("scored, ", 1)[-1].split(" replayed", 1)[0] if proposal else "0"
    return {"case": case, "wall_s": round(wall, 3), "scored": int(scored),
            "replayed": int(replayed) if replayed.isdigit() else None,
            "pick": reason.split(" — ", 1)[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--one", choices=sorted(CASES), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return
    for case in CASES:
        runs = [json.loads(subprocess.run([sys.executable, __file__, "--one", case],
                                          check=True, capture_output=True, text=True).stdout)
                for _ in range(args.repeats)]
        line = dict(runs[0], wall_s=statistics.median(r["wall_s"] for r in runs),
                    walls=[r["wall_s"] for r in runs])
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
