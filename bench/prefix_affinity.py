"""Prefix affinity on a simulated fleet: how much of the prompts the prefix cache reuses, and
what it does to throughput, with one shared queue (off) and with affinity (on).

    python bench/prefix_affinity.py [--groups 300] [--servers 3] [--time-scale 20]
        [--doc-words 700] [--set client.concurrency_per_server=12 ...]

The input holds groups of four prompts sharing a ~4,300-character document, members next to
each other (as a file sorted by document); each run gets its own documents. Both runs go
through the `expansion run` CLI on the same settings but client.prefix_affinity_chars. Ends
with one JSON line: for each mode the cached share of prompt tokens (from the committed rows'
cached_tokens), wall seconds and tok/s, and the ratio on/off of each. The real-SGLang run of
the same comparison is `bench/real_sglang/device.sh affinity` (docs/TUNING.md).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("state cache request token batch decode prefill memory slot pool server shard plan "
         "queue mamba attention layer kernel graph prompt answer reason data train value").split()
JOB = """engine = "sim"
gpus = [0]
servers_per_gpu = {servers}
model = "{model}"
gpu_type = "h200"
weights_gib = 0.04
shard_size = 200
[sim]
gpu = "h200"
sglang_version = "0.5.17"
time_scale = {time_scale}
[server]
mamba_strategy = "extra_buffer"
mem_fraction_static = 0.25
max_mamba_cache_size = 600
max_total_tokens = 400000
[sampling]
max_new_tokens = 16
ignore_eos = true
[tuning]
enabled = false
"""


def write_prompts(path: Path, groups: int, salt: str, doc_words: int) -> None:
    with path.open("w") as fh:
        for g in range(groups):
            rng = random.Random(f"{salt}-{g}")
            doc = " ".join(rng.choice(WORDS) for _ in range(doc_words))
            for k in range(4):
                fh.write(json.dumps({"id": 4 * g + k, "prompt": f"Document {g}: {doc}\n\n"
                                     f"Question {k}: what does line {k} say?"}) + "\n")


def run_mode(work: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    prompts, out = work / f"{mode}.jsonl", work / f"out-{mode}"
    write_prompts(prompts, args.groups, mode, args.doc_words)
    overrides = [a for kv in args.set for a in ("--set", kv)]
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "expansion.cli", "run", "--config",
                    str(work / "job.toml"), "--prompts", str(prompts), "--output", str(out),
                    "--set", f"client.prefix_affinity_chars={0 if mode == 'off' else 1024}",
                    *overrides],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - started
    rows = pl.concat([pl.read_parquet(f) for f in sorted((out / "shards").glob("*.parquet"))])
    per_group = rows.with_columns((pl.col("id") // 4).alias("g")).group_by("g").agg(
        pl.col("server").n_unique().alias("servers"))
    cached, prompt = int(rows["cached_tokens"].sum()), int(rows["prompt_tokens"].sum())
    together = int((per_group["servers"] == 1).sum())
    return {"rows": rows.height, "unique_ids": rows["id"].n_unique(),
            "cached_share": round(cached / prompt, 4),
            "groups_on_one_server": round(together / per_group.height, 3),
            "wall_s": round(wall, 1),
            "output_tok_s_wall": round(int(rows["completion_tokens"].sum()) / wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--groups", type=int, default=300)
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--doc-words", type=int, default=700,
                        help="words in each group's shared document")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a job setting for both runs (as `expansion run --set`)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = ROOT / "tests" / "fixtures" / "models" / "tiny-qwen3-next"
        (work / "job.toml").write_text(JOB.format(servers=args.servers, model=model,
                                                  time_scale=args.time_scale))
        result: dict[str, Any] = {"groups": args.groups, "servers": args.servers,
                                  "settings": args.set,
                                  "off": run_mode(work, "off", args),
                                  "on": run_mode(work, "on", args)}
    on, off = result["on"], result["off"]
    result["cached_share_gain_points"] = round(100 * (on["cached_share"] - off["cached_share"]), 1)
    result["wall_ratio_on_off"] = round(on["wall_s"] / off["wall_s"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
