"""Long and mixed outputs on real SGLang: retraction, committed tok/s, and the cap's steady rate.

Runs on the device like `calibrate.py` (Python 3.12, httpx only, SGLang through the runtime in
/tmp that `device.sh` prepares). For each server of a plan (a JSON list) it starts the server,
saves /server_info, then runs the plan's workloads, each a closed loop of `concurrency` clients
over a fixed, seeded list of requests (written into the results, so the simulator's replay in
CI runs exactly the same list):

* `lognormal`: prompt lengths uniform in [lo, hi], per-row `max_new_tokens` drawn lognormal by
  mean and p99 (clipped), the first `long_first` rows at the clip — what a reasoning model's
  training-data job asks for. `ignore_eos` makes each row's length its max_new_tokens, so the
  replay knows every output length.
* `fixed`: P prompt tokens, O output tokens, `caps` × the server's cap requests, `concurrency`
  "cap" = the server's own cap: the steady rate at the cap that `expansion plan` predicts.

Every answer's start, end, prompt, completion and cached tokens; /metrics once a second (the
gauges plus the generation, prompt and retraction counters); the server log.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
from pathlib import Path
from typing import Any

import httpx
from calibrate import Server, find_key, gpu_used_mib, pack, parse_gauges
from probe_limits import counter

COUNTERS = ("sglang:generation_tokens_total", "sglang:prompt_tokens_total",
            "sglang:num_retracted_requests_total", "sglang:num_requests_total")


def lognormal_lengths(n: int, mean: float, p99: float, lo: int, hi: int,
                      rng: random.Random) -> list[int]:
    """n lengths with the given mean and 99th percentile (before clipping to [lo, hi])."""
    z99 = 2.3263
    sigma = z99 - math.sqrt(z99 * z99 - 2.0 * math.log(p99 / mean))
    mu = math.log(mean) - sigma * sigma / 2.0
    return [max(lo, min(hi, int(rng.lognormvariate(mu, sigma)))) for _ in range(n)]


def request_list(run: dict[str, Any], cap: int) -> list[tuple[int, int]]:
    """(prompt tokens, max_new_tokens) per request, in send order."""
    rng = random.Random(run.get("seed", 1))
    if run["workload"] == "fixed":
        n = int(run.get("requests") or run.get("caps", 4) * cap)
        return [(int(run["prompt_tokens"]), int(run["output_tokens"]))] * n
    lo, hi = run["prompt_range"]
    n = int(run["requests"])
    outs = lognormal_lengths(n, run["mean"], run["p99"], run.get("min_out", 16),
                             run["max_out"], rng)
    for i in range(min(run.get("long_first", 0), n)):
        outs[i] = run["max_out"]
    return [(rng.randint(lo, hi), o) for o in outs]


POOL = 16  # workers per httpx client: httpcore's pool is O(N²) in its connections
# (docs/BENCHMARKS.md "httpx's pool is quadratic"; session 8's first probe used one client for
# 245 workers and the NemotronH-4B server idled 3–5 s after each wave of 237 answers)


async def closed_loop(url: str, reqs: list[tuple[int, int]], concurrency: int, vocab: int,
                      max_s: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    answers: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    queue = list(enumerate(reqs))
    queue.reverse()
    started = time.time()
    end = time.monotonic() + max_s
    clients = [httpx.AsyncClient(timeout=max_s + 60, limits=httpx.Limits(
        max_connections=POOL, max_keepalive_connections=POOL))
        for _ in range((concurrency + POOL - 1) // POOL)]

    async def worker(client: httpx.AsyncClient) -> None:
        while queue and time.monotonic() < end:
            index, (plen, out) = queue.pop()
            ids = [rng.randrange(3, vocab) for _ in range(plen)]
            t0 = time.time()
            resp = await client.post(f"{url}/generate", json={
                "input_ids": ids, "sampling_params": {
                    "max_new_tokens": out, "temperature": 0, "ignore_eos": True}})
            meta = resp.json().get("meta_info", {}) if resp.status_code == 200 else {}
            answers.append({"i": index, "status": resp.status_code, "start": t0,
                            "end": time.time(), "prompt_tokens": meta.get("prompt_tokens"),
                            "completion_tokens": meta.get("completion_tokens"),
                            "cached_tokens": meta.get("cached_tokens")})

    async def sampler(client: httpx.AsyncClient) -> None:
        while time.monotonic() < end:
            try:
                text = (await client.get(f"{url}/metrics")).text
            except httpx.HTTPError:
                await asyncio.sleep(1.0)
                continue
            samples.append({"t": time.time(), **parse_gauges(text),
                            **{c: counter(text, c) for c in COUNTERS}})
            await asyncio.sleep(1.0)

    async with httpx.AsyncClient(timeout=30) as probe:
        sampling = asyncio.create_task(sampler(probe))
        workers = [asyncio.create_task(worker(clients[i // POOL])) for i in range(concurrency)]
        await asyncio.wait(workers, timeout=max_s + 30)
        ended = time.time()
        for task in [*workers, sampling]:
            task.cancel()
        after = (await probe.get(f"{url}/metrics")).text
    for client in clients:
        await client.aclose()
    committed = sum(a["completion_tokens"] or 0 for a in answers)
    return {"started": started, "ended": ended, "wall_s": round(ended - started, 2),
            "requests_sent": len(reqs) - len(queue), "answered": len(answers),
            "errors": sum(1 for a in answers if a["status"] != 200),
            "committed_tokens": committed,
            "committed_tok_s": round(committed / max(1e-9, ended - started), 1),
            "retracted": counter(after, "sglang:num_retracted_requests_total"),
            "answers": answers, "metrics": samples}


def run_server(cfg: dict[str, Any], args: argparse.Namespace, work: Path,
               deadline: float) -> dict[str, Any]:
    server = Server(cfg["name"], cfg["model"], cfg["flags"], args.port, work)
    server.argv[1] = args.run_sh
    record: dict[str, Any] = {"name": cfg["name"], "model": cfg["model"], "flags": cfg["flags"],
                              "argv": server.argv, "runs": []}
    try:
        record["startup_s"] = round(server.start(min(480.0, deadline - time.monotonic())), 1)
        info = httpx.get(f"{server.url}/server_info", timeout=30).json()
        (work / f"{cfg['name']}.server_info.json").write_text(json.dumps(info, indent=1))
        cap = int(find_key(info, "effective_max_running_requests_per_dp")
                  or find_key(info, "max_running_requests"))
        record |= {"max_running_requests": cap,
                   "max_total_num_tokens": find_key(info, "max_total_num_tokens"),
                   "max_mamba_cache_size": find_key(info, "max_mamba_cache_size"),
                   "gpu_used_mib_loaded": gpu_used_mib()}
        print(f"{cfg['name']}: healthy in {record['startup_s']} s, cap {cap}, "
              f"KV {record['max_total_num_tokens']}", flush=True)
        for run in cfg["runs"]:
            budget = deadline - time.monotonic() - 20
            if budget < run.get("min_s", 40):
                record["runs"].append({"name": run["name"], "skipped": "device time budget"})
                continue
            reqs = request_list(run, cap)
            conc = cap if run.get("concurrency") == "cap" else int(run["concurrency"])
            result = asyncio.run(closed_loop(server.url, reqs, conc, cfg.get("vocab", 240000),
                                             min(run.get("max_s", 600), budget),
                                             run.get("seed", 1)))
            record["runs"].append({**run, "concurrency": conc, "requests_list": reqs, **result})
            print(f"{cfg['name']} {run['name']}: {result['committed_tok_s']} tok/s committed, "
                  f"{result['answered']}/{len(reqs)} answered, retracted {result['retracted']}, "
                  f"{result['wall_s']} s", flush=True)
            (work / "results.json").write_text(json.dumps(record, indent=1))
    except Exception as exc:  # record and move on: the next server may still run
        record["error"] = f"{type(exc).__name__}: {exc}"
        print(f"{cfg['name']}: {record['error']}", flush=True)
    finally:
        record["stop"] = server.stop()
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--plan", required=True, help="JSON file: a list of servers and runs")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--name", default="long")
    parser.add_argument("--budget-s", type=float, default=560)
    parser.add_argument("--port", type=int, default=30300)
    parser.add_argument("--run-sh", default="/tmp/run-sglang.sh")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget_s
    work = Path("/tmp") / args.name
    work.mkdir(parents=True, exist_ok=True)
    results = []
    for cfg in json.loads(Path(args.plan).read_text()):
        if time.monotonic() > deadline - cfg.get("needs_s", 120):
            results.append({"name": cfg["name"], "skipped": "device time budget"})
            continue
        results.append(run_server(cfg, args, work, deadline))
        (work / "results.json").write_text(json.dumps(results, indent=1))
        pack(work, args.out)
    (work / "results.json").write_text(json.dumps(results, indent=1))
    pack(work, args.out)


if __name__ == "__main__":
    main()
