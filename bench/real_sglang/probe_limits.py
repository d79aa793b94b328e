"""Measure two limits of real SGLang the tuner must respect: retraction and the prefix cache.

Runs on the device like `calibrate.py` (Python 3.12, httpx only, SGLang through
`.real-sglang/run.sh`). Three tiny Qwen3-Next servers start at once on the one GPU:

* `retract` (extra_buffer, a KV pool of `--max-total-tokens` tokens, a cap of 256): closed-loop
  clients at several concurrencies send 64-token prompts for up to 1,024 new tokens *without*
  `ignore_eos` (random weights sample EOS about once in 1,024 tokens). SGLang then reserves
  only `new_token_ratio` × max_new_tokens per request, admits more than the pool sustains as
  the ratio decays, and retracts when decode runs out of KV. Each level records tok/s from the
  generation counter, retractions from the retraction counter and the log, running requests and
  the ratio. The same concurrency with `ignore_eos` (full reservation) is the no-thrash control.
* `prefix-eb` (extra_buffer) and `prefix-nb` (no_buffer, overlap off): prompts that share a
  long prefix in groups; `cached_tokens` of every answer says what the radix cache reused —
  grouped order, interleaved order, and (no_buffer) with the bare prefix sent first, since
  no_buffer keeps mamba states only at the ends of cached sequences.

Everything lands in /tmp/<name>/ and is packed into $OUT/<name>.tar.gz.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import httpx
from calibrate import Server, gpu_used_mib, pack, parse_gauges

TINY = "tiny-qwen3-next"
VOCAB = 1000
BASE = ["--cuda-graph-max-bs", "32", "--disable-prefill-cuda-graph", "--skip-tokenizer-init"]
SERVERS = {
    "retract": ["--mem-fraction-static", "0.35", "--mamba-radix-cache-strategy", "extra_buffer",
                "--max-total-tokens", "24576", "--max-running-requests", "256",
                "--max-mamba-cache-size", "1400"],
    "prefix-eb": ["--mem-fraction-static", "0.2", "--mamba-radix-cache-strategy",
                  "extra_buffer"],
    "prefix-nb": ["--mem-fraction-static", "0.2", "--mamba-radix-cache-strategy", "no_buffer",
                  "--disable-overlap-schedule"],
}


def counter(text: str, name: str) -> float:
    """Sum of every sample of one metric (counters carry labels; absent: 0)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except ValueError:
                continue
    return total


async def closed_loop(url: str, clients: int, seconds: float, ignore_eos: bool,
                      seed: int) -> dict[str, Any]:
    """`clients` workers, each sending its next request when the last answers."""
    rng = random.Random(seed)
    done: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    end = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=900, limits=limits) as client:
        before = (await client.get(f"{url}/metrics")).text

        async def worker() -> None:
            while time.monotonic() < end:
                ids = [rng.randrange(3, VOCAB) for _ in range(64)]
                params = {"max_new_tokens": 1024, "temperature": 1.0, "ignore_eos": ignore_eos}
                resp = await client.post(f"{url}/generate",
                                         json={"input_ids": ids, "sampling_params": params})
                meta = resp.json().get("meta_info", {}) if resp.status_code == 200 else {}
                done.append({"status": resp.status_code,
                             "completion_tokens": meta.get("completion_tokens")})

        async def sampler() -> None:
            while time.monotonic() < end:
                text = (await client.get(f"{url}/metrics")).text
                samples.append({"t": time.time(), **parse_gauges(text)})
                await asyncio.sleep(1.0)

        tasks = [asyncio.create_task(worker()) for _ in range(clients)]
        await asyncio.wait([asyncio.create_task(sampler()), *tasks], timeout=seconds + 1)
        after = (await client.get(f"{url}/metrics")).text
        for task in tasks:
            task.cancel()
    running = [s.get("sglang:num_running_reqs", 0.0) for s in samples]
    gen = counter(after, "sglang:generation_tokens_total") - counter(
        before, "sglang:generation_tokens_total")
    return {"clients": clients, "ignore_eos": ignore_eos, "seconds": seconds,
            "tok_s": round(gen / seconds, 1), "completed": len(done),
            "mean_completion_tokens": round(sum(d["completion_tokens"] or 0 for d in done)
                                            / max(1, len(done)), 1),
            "errors": sum(1 for d in done if d["status"] != 200),
            "retracted": counter(after, "sglang:num_retracted_requests_total")
            - counter(before, "sglang:num_retracted_requests_total"),
            "mean_running": round(sum(running) / max(1, len(running)), 1),
            "max_running": max(running, default=0.0), "samples": samples}


def group_prompts(groups: int, per_group: int, prefix_len: int, seed: int,
                  interleave: bool) -> list[tuple[int, list[int]]]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, VOCAB) for _ in range(prefix_len)] for _ in range(groups)]
    members = [[(g, prefixes[g] + [rng.randrange(3, VOCAB) for _ in range(24)])
                for _ in range(per_group)] for g in range(groups)]
    if interleave:
        return [members[g][k] for k in range(per_group) for g in range(groups)]
    return [m for group in members for m in group]


async def send_all(url: str, prompts: list[tuple[int, list[int]]],
                   concurrency: int) -> dict[str, Any]:
    """Prompts in order, `concurrency` at a time; cached_tokens of each answer."""
    sem = asyncio.Semaphore(concurrency)
    answers: list[dict[str, Any]] = []
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=600) as client:

        async def one(group: int, ids: list[int]) -> None:
            async with sem:
                params = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
                resp = await client.post(f"{url}/generate",
                                         json={"input_ids": ids, "sampling_params": params})
                meta = resp.json().get("meta_info", {})
                answers.append({"group": group, "prompt_tokens": meta.get("prompt_tokens"),
                                "cached_tokens": meta.get("cached_tokens")})

        tasks = []
        for group, ids in prompts:
            tasks.append(asyncio.create_task(one(group, ids)))
            await asyncio.sleep(0)  # keep submission order
        await asyncio.gather(*tasks)
    prompt = sum(a["prompt_tokens"] or 0 for a in answers)
    cached = sum(a["cached_tokens"] or 0 for a in answers)
    return {"requests": len(answers), "wall_s": round(time.monotonic() - started, 2),
            "prompt_tokens": prompt, "cached_tokens": cached,
            "cached_share": round(cached / max(1, prompt), 4),
            "hits": sum(1 for a in answers if (a["cached_tokens"] or 0) > 0),
            "answers": answers}


async def prefix_runs(server: Server, concurrency: int) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    shapes = SHAPES_NB if "no_buffer" in server.argv else SHAPES_EB
    for index, (name, interleave, warm, conc, plen) in enumerate(shapes):
        prompts = group_prompts(48, 4, plen, seed=100 + index + 10 * len(shapes),
                                interleave=interleave)
        if warm == "bare":
            firsts = {g: ids[:plen] for g, ids in reversed(prompts)}
            warmed = await send_all(server.url, list(firsts.items()), concurrency)
            runs.append({"shape": "bare-prefixes", **warmed})
        elif warm == "leader":  # one member of each group first: what affinity dispatch does
            leaders = {g: (g, ids) for g, ids in reversed(prompts)}
            first = await send_all(server.url, list(leaders.values()), concurrency)
            runs.append({"shape": "leaders", **first})
            prompts = [p for p in prompts if all(p is not q for q in leaders.values())]
        result = await send_all(server.url, prompts, conc)
        runs.append({"shape": name, **result})
        print(f"{server.name} {name}: cached {result['cached_share']:.1%} "
              f"hits {result['hits']}/{result['requests']} in {result['wall_s']} s", flush=True)
    return runs


# (name, interleave, warm-up, concurrency, prefix tokens)
SHAPES_EB = [("grouped-c1", False, None, 1, 1536), ("leader-first", False, "leader", 8, 1536),
             ("interleaved-1400", True, None, 8, 1400)]
SHAPES_NB = [("leader-first", False, "leader", 8, 1536)]


def start_all(servers: list[Server], timeout_s: float) -> dict[str, float]:
    """Start every server at once (they share the GPU), wait for each to be healthy."""
    import subprocess
    started = time.monotonic()
    for s in servers:
        s.proc = subprocess.Popen(s.argv, stdout=s.log_path.open("wb"),
                                  stderr=subprocess.STDOUT, start_new_session=True)
    healthy: dict[str, float] = {}
    while len(healthy) < len(servers) and time.monotonic() - started < timeout_s:
        if all(s.name in healthy or (s.proc is not None and s.proc.poll() is not None)
               for s in servers):
            break  # the rest exited: their logs say why
        for s in servers:
            if s.name in healthy:
                continue
            try:
                if httpx.get(f"{s.url}/health", timeout=2).status_code == 200:
                    healthy[s.name] = round(time.monotonic() - started, 1)
            except httpx.HTTPError:
                pass
        time.sleep(0.5)
    return healthy


def stop_all(servers: list[Server]) -> dict[str, Any]:
    """SIGTERM every server at once, then time until the GPU's memory is back."""
    import os
    import signal
    import subprocess
    started = time.monotonic()
    before = gpu_used_mib()
    for s in servers:
        if s.proc is not None and s.proc.poll() is None:
            os.killpg(s.proc.pid, signal.SIGTERM)
    for s in servers:
        if s.proc is not None:
            try:
                s.proc.wait(60)
            except subprocess.TimeoutExpired:  # a stuck server is killed, not waited on
                os.killpg(s.proc.pid, signal.SIGKILL)
    while (gpu_used_mib() or 0) > 1024 and time.monotonic() - started < 60:
        time.sleep(0.5)
    return {"gpu_used_mib_before_stop": before, "released_s": round(time.monotonic() - started, 1),
            "gpu_used_mib_after_stop": gpu_used_mib()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--name", default="limits")
    parser.add_argument("--level-s", type=float, default=40)
    parser.add_argument("--budget-s", type=float, default=540)
    parser.add_argument("--run-sh", default="/tmp/run-sglang.sh")
    parser.add_argument("--only", default="", help="comma-separated server names (default all)")
    parser.add_argument("--levels", default="16,48,96,192,96e",
                        help="retract levels: client counts, 'e' = with ignore_eos")
    parser.add_argument("--graph-bs", type=int, default=32, help="--cuda-graph-max-bs")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget_s
    work = Path("/tmp") / args.name
    work.mkdir(parents=True, exist_ok=True)
    chosen = args.only.split(",") if args.only else list(SERVERS)
    base = [*BASE[:1], str(args.graph_bs), *BASE[2:]]
    servers = [Server(name, TINY, base + flags, 30200 + i, work)
               for i, (name, flags) in enumerate(SERVERS.items()) if name in chosen]
    for s in servers:  # device.sh's run.sh keeps the runtime and its JIT caches in /tmp
        s.argv[1] = args.run_sh
    record: dict[str, Any] = {"gpu_used_mib_idle": gpu_used_mib(),
                              "argv": {s.name: s.argv for s in servers}}
    try:
        # one after another: a server sizes its pools from the memory free when it starts
        by = {s.name: s for s in servers}
        record["healthy_after_s"] = {}
        for s in servers:
            record["healthy_after_s"] |= start_all([s], 300)
        print("healthy:", record["healthy_after_s"], flush=True)
        for name in ("prefix-eb", "prefix-nb"):
            if name in record["healthy_after_s"]:
                record[name] = asyncio.run(prefix_runs(by[name], 8))
            (work / "results.json").write_text(json.dumps(record, indent=1))
        if "retract" in record["healthy_after_s"]:
            levels = [(int(v.rstrip("e")), v.endswith("e")) for v in args.levels.split(",")]
            record["retract"] = []
            for clients, ignore in levels:
                if time.monotonic() > deadline - args.level_s - 30:
                    record["retract_skipped_from"] = clients
                    break
                level = asyncio.run(closed_loop(by["retract"].url, clients, args.level_s,
                                                ignore, seed=clients))
                record["retract"].append(level)
                print(f"retract c={clients} ignore_eos={ignore}: {level['tok_s']} tok/s, "
                      f"retracted {level['retracted']}, running {level['mean_running']}",
                      flush=True)
                (work / "results.json").write_text(json.dumps(record, indent=1))
    finally:
        record["stop"] = stop_all(servers)
        (work / "results.json").write_text(json.dumps(record, indent=1))
        pack(work, args.out)


if __name__ == "__main__":
    main()
