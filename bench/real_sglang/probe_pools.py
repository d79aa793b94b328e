"""What real SGLang allocates at start-up, for many configurations in one device call.

Runs on the device (Python 3.12, standard library only) like `probe_long.py`. For each entry of
a plan (a JSON list of {name, model, flags, [fallback]}) it starts the server and reads its log
until the pools are final (`max_total_num_tokens=… max_running_requests=…`, printed after the
decode CUDA graphs are captured), then kills it: no warm-up, no health wait, so a start costs
the seconds to that line. A start that fails is retried once with the entry's `fallback` flags
(e.g. another attention backend). Everything lands in the log files and `results.json`, which
the memory model's CI test reads (tests/unit/test_real_families.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

RUNTIME = Path(".real-sglang")
COMMON = ["--load-format", "dummy", "--sampling-backend", "pytorch", "--grammar-backend",
          "none", "--enable-metrics", "--host", "127.0.0.1", "--skip-tokenizer-init"]
FINAL = re.compile(r"max_total_num_tokens=(\d+).*?max_running_requests=(\d+).*?context_len=(\d+)")
LINES = {  # what the log says of each pool, as numbers (the CI test parses the raw log too)
    "weights_gib": r"Load weight end\..*?mem usage=([\d.]+) GB",
    "avail_before_load_gib": r"Load weight begin\. avail mem=([\d.]+) GB",
    "mamba_slots": r"max_mamba_cache_size: (\d+)",
    "conv_state_gb": r"conv_state size: ([\d.]+)GB",
    "ssm_state_gb": r"ssm_state size: ([\d.]+)GB",
    "kv_tokens": r"KV Cache is allocated\..*?#tokens: (\d+)",
    "mamba_capped_to": r"max_running_requests is capped to (\d+)",
}


def read_pools(text: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, pattern in LINES.items():
        match = re.search(pattern, text)
        if match:
            found[key] = float(match.group(1)) if "." in match.group(1) else int(match.group(1))
    final = FINAL.search(text)
    if final:
        found |= {"max_total_num_tokens": int(final.group(1)),
                  "max_running_requests": int(final.group(2)),
                  "context_len": int(final.group(3))}
    return found


def start_and_read(name: str, model: str, flags: list[str], args: argparse.Namespace,
                   work: Path) -> dict[str, Any]:
    """Start one server, wait for the final pool line (or an exit), kill it."""
    argv = ["bash", args.run_sh, "python3", "-m", "sglang.launch_server", "--model-path",
            str(RUNTIME / "models" / model), *COMMON, "--port", str(args.port), *flags]
    log_path = work / f"{name}.log"
    started = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        outcome = "timeout"
        while time.monotonic() - started < args.per_start_s:
            text = log_path.read_text(errors="replace")
            if FINAL.search(text):
                outcome = "ok"
                break
            if proc.poll() is not None:
                outcome = f"exited {proc.returncode}"
                break
            time.sleep(0.5)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    text = log_path.read_text(errors="replace")
    time.sleep(2)  # the GPU's memory is back before the next start measures what is free
    return {"name": name, "model": model, "flags": flags, "outcome": outcome,
            "seconds": round(time.monotonic() - started, 1), **read_pools(text)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--plan", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--name", default="pools")
    parser.add_argument("--budget-s", type=float, default=560)
    parser.add_argument("--per-start-s", type=float, default=200)
    parser.add_argument("--port", type=int, default=30400)
    parser.add_argument("--run-sh", default="/tmp/run-sglang.sh")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget_s
    work = Path("/tmp") / args.name
    work.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    for entry in json.loads(Path(args.plan).read_text()):
        if time.monotonic() > deadline - 40:
            results.append({"name": entry["name"], "outcome": "skipped: device time budget"})
            continue
        args.per_start_s = min(args.per_start_s, deadline - time.monotonic())
        record = start_and_read(entry["name"], entry["model"], entry["flags"], args, work)
        if record["outcome"] != "ok" and entry.get("fallback") is not None:
            retry = start_and_read(entry["name"] + "-fallback", entry["model"],
                                   entry["flags"] + entry["fallback"], args, work)
            record = retry | {"first_try": record}
        print(json.dumps({k: v for k, v in record.items() if k != "first_try"}), flush=True)
        results.append(record)
        (work / "results.json").write_text(json.dumps(results, indent=1))
        with tarfile.open(args.out / f"{args.name}.tar.gz", "w:gz") as tar:
            tar.add(work, arcname=work.name)


if __name__ == "__main__":
    main()
