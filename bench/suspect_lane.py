"""A row that kills every server it runs on, at a large client cap: how long the job takes,
how many deaths find the killer, and whether every other row is answered once.

    python bench/suspect_lane.py [--rows 3000] [--cap 512] [--servers 2] [--tree PATH]

At a cap of 512 a death implicates up to 512 prompts. Run one suspect per server (the lane
before group testing), they trickle through at one per server while the rest of the job
runs, and every later death implicates the next full batch; in groups that shrink 8-fold with
each death (tasks/suspects.py) they clear in a few request times. The job goes through the
`expansion run` CLI on the simulator, dead servers relaunched as in any run; `--tree` runs
another checkout's code on the same input (an earlier commit, for the comparison in
docs/BENCHMARKS.md). Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
JOB = """engine = "sim"
gpus = {gpus}
model = "Qwen/Qwen2.5-0.5B-Instruct"
gpu_type = "h200"
shard_size = 100
stop_grace_s = 5.0
[sim]
gpu = "h200"
sglang_version = "0.5.17"
time_scale = {time_scale}
startup_s = 0.5
faults = {{ crash_on_text = "POISON" }}
[server]
max_running_requests = {cap}
[client]
concurrency_per_server = {cap}
[sampling]
max_new_tokens = {tokens}
ignore_eos = true
[tuning]
enabled = false
"""


def run(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "job.toml").write_text(JOB.format(
            gpus=list(range(args.servers)), time_scale=args.time_scale, cap=args.cap,
            tokens=args.tokens))
        prompts, out = work / "p.jsonl", work / "out"
        with prompts.open("w") as fh:
            for i in range(args.rows):
                text = "POISON pill" if i == args.rows // 10 else f"question {i} about state"
                fh.write(json.dumps({"id": f"r{i:06d}", "prompt": text}) + "\n")
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "expansion.cli", "run", "--config",
                               str(work / "job.toml"), "--prompts", str(prompts), "--output",
                               str(out)], cwd=tree, capture_output=True, text=True,
                              timeout=args.timeout_s)
        wall = time.monotonic() - started
        if args.log:
            args.log.write_text(done.stderr)
        rows = pl.read_parquet(out / "shards" / "*.parquet") if done.returncode == 0 else None
        errors = (pl.read_parquet(out / "errors" / "*.parquet")
                  if rows is not None and (out / "errors").is_dir() else None)
        reason = str(errors["error"][0]) if errors is not None and errors.height else ""
        deaths = re.search(r"\(([^)]*) died while it ran", reason)  # the servers it killed
        return {"tree": str(tree), "exit": done.returncode, "wall_s": round(wall, 1),
                "answered": rows.height if rows is not None else 0,
                "unique": rows["id"].n_unique() if rows is not None else 0,
                "error_rows": errors.height if errors is not None else 0,
                "errors": (dict(zip(errors["id"].to_list(), errors["error"].to_list(),
                                    strict=True)) if errors is not None else {}),
                "deaths_to_quarantine": len(deaths[1].split(", ")) if deaths else None,
                "relaunches": len(re.findall(r"restarted as relaunch", done.stderr))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--cap", type=int, default=512)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--tree", type=Path, default=ROOT)
    parser.add_argument("--log", type=Path, help="keep the run's stderr here")
    args = parser.parse_args()
    print(json.dumps(run(args.tree.resolve(), args)))


if __name__ == "__main__":
    main()
