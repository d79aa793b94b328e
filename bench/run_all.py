"""The pipeline's own speed: does the client keep the (simulated) GPUs busy?

    python bench/run_all.py [--repeats 3] [--quick]

1. pipeline efficiency: achieved tok/s (modeled GPU time, from the servers' own token
   counters) ÷ the simulator's analytic maximum for the config, and occupancy (running ÷ cap),
   for 2, 8 and 32 simulated servers at two time scales each;
2. dispatcher throughput against an instant server, relative to a bare async httpx loop on
   the same server, and client CPU seconds per 1,000 completions.
Medians of --repeats runs; ends with one JSON line (`pipeline_efficiency` is the lowest
across configurations).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL, GPU, VERSION = "qwen3.6-27b-fp8", "rtx-pro-6000", "0.5.23"
MAX_NEW = 2048  # long requests keep the request rate within what 2 cores can serve
MEAN_COMPLETION = 0.755 * MAX_NEW  # E[min(U(0.3, 1.3), 1)] × max_new_tokens (infra/sim/text)


def analytic_max_tok_s(servers: int, prompt_tokens: float) -> tuple[float, int]:
    """Per-fleet tokens/s of the simulator at its cap, prefill stalls included.

    With R requests of L output tokens running, each completion admits one request whose
    prefill stalls the batch: time per R·L tokens = L·step(R) + R·prefill(prompt)."""
    from infra.sglang.flags import ServerFlags
    from infra.sglang.memory import plan_memory
    from infra.sglang.profiles import gpu_profile, model_profile
    from infra.sglang.roofline import build_roofline

    model, gpu = model_profile(MODEL), gpu_profile(GPU)
    flags = ServerFlags(mamba_strategy="no_buffer")
    plan = plan_memory(model, gpu, flags, VERSION)
    roof = build_roofline(model, gpu, flags, plan)
    r, length = plan.max_running_requests, MEAN_COMPLETION
    step = roof.decode_step_s(r, prompt_tokens + length / 2)
    per_server = r * length / (length * step + r * roof.prefill_s(int(prompt_tokens)))
    return servers * per_server, r


@dataclass(frozen=True)
class PipelineResult:
    efficiency: float  # fleet tok/s (modeled time) in steady state ÷ analytic maximum
    occupancy: float  # mean running requests ÷ cap over the same window
    client_cpu_s: float  # CPU seconds of this process for the whole dispatch


def steady_window(series: list[tuple[float, float]]) -> tuple[float, float, float, float]:
    """(t0, tokens0, t1, tokens1) where the fleet's cumulative token count crosses 20 % and
    80 % of its final value, interpolated between samples: ramp-up and the final drain of a
    finite job are not the pipeline's speed."""
    total = series[-1][1]

    def crossing(level: float) -> tuple[float, float]:
        for (ta, va), (tb, vb) in itertools.pairwise(series):
            if va < level <= vb:
                return ta + (tb - ta) * (level - va) / (vb - va), level
        raise ValueError("the token series never crosses the level")

    (t0, v0), (t1, v1) = crossing(0.2 * total), crossing(0.8 * total)
    return t0, v0, t1, v1


def pipeline_run(servers: int, time_scale: float, prompts: int) -> PipelineResult:
    """One run of the generate pipeline's dispatch path (no Prefect: the dispatcher, shard
    commits, the fleet monitor and the servers are what is measured).

    Achieved throughput is read from the servers' own `generation_tokens_total` counters,
    sampled every second by the same FleetMonitor the flow runs: counted per finished request,
    so it is not quantized by shard commits."""
    from infra.settings import load_settings
    from infra.sim.text import count_prompt_tokens
    from tasks.capacity import measure_one
    from tasks.engines import build_engine
    from tasks.health import wait_until_healthy
    from tasks.local_servers import launch_fleet, registry_for, stop_fleet
    from tasks.monitor import FleetMonitor, SGLangMetrics
    from tasks.shards import generate_pending, prepare_job

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "p.jsonl"
        texts = [f"Explain item {i} of the benchmark in a few sentences." for i in range(prompts)]
        src.write_text("".join(json.dumps({"id": i, "prompt": t}) + "\n"
                               for i, t in enumerate(texts)))
        settings = load_settings(None, engine="sim", gpus=list(range(servers)),
                                 model=MODEL, output=str(Path(tmp) / "out"), base_port=21000,
                                 shard_size=50, **{
                                     "sim.gpu": GPU, "sim.time_scale": time_scale,
                                     "sim.startup_s": 0.5, "sim.sglang_version": VERSION,
                                     "server.mamba_strategy": "no_buffer",
                                     "sampling.max_new_tokens": MAX_NEW})
        out = Path(settings.output)
        state = prepare_job(src, out, settings.shard_size)
        engine = build_engine(settings)
        handles = launch_fleet(engine.launch_specs(settings.server, out),
                               registry_for(out),
                               "b", 5.0)
        monitor = FleetMonitor(1.0, None, SGLangMetrics())
        try:
            wait_until_healthy(handles, None, 120.0)
            caps = [measure_one(h, None) for h in handles]
            monitor.watch({f"server-{h.index}": h.url for h in handles}, 0)
            monitor.sample_now()
            monitor.start()
            cpu0 = resource.getrusage(resource.RUSAGE_SELF)
            generate_pending(settings, state, caps, engine.requests)
            cpu1 = resource.getrusage(resource.RUSAGE_SELF)
            monitor.stop()
            monitor.sample_now()
        finally:
            stop_fleet(handles, registry_for(out), 5.0)
    rounds: dict[float, list[Any]] = {}
    for sample in monitor.snapshot():
        rounds.setdefault(sample.t, []).append(sample)
    series = [(t, sum(s.generation_tokens_total or 0.0 for s in group))
              for t, group in sorted(rounds.items())]
    t0, v0, t1, v1 = steady_window(series)
    achieved = (v1 - v0) / (t1 - t0) / time_scale
    prompt_tokens = statistics.fmean(count_prompt_tokens(t) for t in texts)
    maximum, cap = analytic_max_tok_s(servers, prompt_tokens)
    in_window = [s.running or 0 for t, group in rounds.items() if t0 <= t <= t1 for s in group]
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return PipelineResult(achieved / maximum, statistics.fmean(in_window) / cap, cpu)


async def _instant_server(port: int) -> asyncio.AbstractServer:
    body = json.dumps({"text": "ok", "output_ids": [1], "meta_info": {
        "id": "x", "finish_reason": {"type": "stop"}, "prompt_tokens": 3,
        "completion_tokens": 1}}).encode()
    response = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(body)).encode() + b"\r\n\r\n" + body)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                writer.write(response)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", port)


def instant_server_process(port: int) -> subprocess.Popen[bytes]:
    code = (f"import asyncio, sys; sys.path.insert(0, {str(ROOT)!r}); "
            "from bench.run_all import _instant_server\n"
            "async def main():\n"
            f"    s = await _instant_server({port})\n"
            "    await s.serve_forever()\n"
            "asyncio.run(main())")
    proc = subprocess.Popen([sys.executable, "-c", code])
    time.sleep(1.0)
    return proc


def bare_loop(url: str, n: int, concurrency: int, pool_size: int | None = None) -> float:
    """Requests/s of the simplest async loop: `concurrency` coroutines posting in turn.

    pool_size=None shares one httpx client (the textbook loop); a number gives each group of
    that many coroutines its own client, as the dispatcher does (see tasks/dispatch.py)."""
    import httpx

    from infra.sglang.client import tls_context

    async def main() -> float:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(n):
            queue.put_nowait(i)
        size = pool_size or concurrency + 8
        limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
        clients = [httpx.AsyncClient(limits=limits, verify=tls_context())
                   for _ in range(0, concurrency, size)]

        async def worker(client: httpx.AsyncClient) -> None:
            while not queue.empty():
                queue.get_nowait()
                resp = await client.post(f"{url}/generate", json={"text": "x"})
                resp.json()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(clients[i // size]) for i in range(concurrency)))
        rate = n / (time.perf_counter() - t0)
        for client in clients:
            await client.aclose()
        return rate

    return asyncio.run(main())


def dispatcher_loop(url: str, n: int, concurrency: int) -> tuple[float, float]:
    from infra.prompt_row import PromptRow
    from tasks.dispatch import Dispatcher, DispatchOptions, Endpoint

    opts = DispatchOptions("m", None, {"max_new_tokens": 8, "temperature": 0.7, "top_p": 0.9,
                                       "seed": 1}, 30.0, 3, 0.01)

    async def commit(shard: int, rows: list[Any], errors: list[Any]) -> None:
        return None

    shards = [(s, [PromptRow(f"{s}-{i}", prompt="x") for i in range(100)])
              for s in range(n // 100)]
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    asyncio.run(Dispatcher([Endpoint("s", url, concurrency, "c")], opts, commit).run(
        iter(shards)))
    rate = n / (time.perf_counter() - t0)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return rate, cpu / n * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="2 and 8 servers, one time scale")
    ap.add_argument("--configs", default="2:10,2:40,8:10,8:40,32:2,32:5",
                    help="servers:time_scale pairs to measure")
    ap.add_argument("--big-repeats", type=int, default=None,
                    help="runs of 32+-server configurations (default: --repeats)")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    print('| configuration | efficiency | occupancy | client CPU / 1,000 | runs |')
    configs = [(int(a), float(b)) for a, b in (c.split(":") for c in args.configs.split(","))]
    if args.quick:
        configs = [(2, 10.0), (8, 10.0)]
    for servers, scale in configs:
        repeats = (args.big_repeats or args.repeats) if servers >= 32 else args.repeats
        runs = [pipeline_run(servers, scale, prompts=servers * 52 * 8) for _ in range(repeats)]
        row = {"servers": servers, "time_scale": scale, "runs": len(runs),
               "efficiency": round(statistics.median(r.efficiency for r in runs), 3),
               "occupancy": round(statistics.median(r.occupancy for r in runs), 3),
               "client_cpu_s_per_1000": round(statistics.median(
                   r.client_cpu_s for r in runs) / (servers * 52 * 8) * 1000, 2)}
        rows.append(row)
        print(f"| {servers} servers, time scale {scale:g} | {row['efficiency']:.3f} | "
              f"{row['occupancy']:.3f} | {row['client_cpu_s_per_1000']:.2f} s | {len(runs)} |",
              flush=True)

    from tasks.dispatch import POOL_CONNECTIONS

    port = 28900
    server = instant_server_process(port)
    try:
        url = f"http://127.0.0.1:{port}"
        n, conc = 5000, 64
        naive = [bare_loop(url, n, conc) for _ in range(args.repeats)]
        bare = [bare_loop(url, n, conc, POOL_CONNECTIONS) for _ in range(args.repeats)]
        disp = [dispatcher_loop(url, n, conc) for _ in range(args.repeats)]
    finally:
        server.kill()
    naive_rate = statistics.median(naive)
    bare_rate = statistics.median(bare)
    disp_rate = statistics.median(r for r, _ in disp)
    cpu_per_1000 = statistics.median(c for _, c in disp)
    print(f"| dispatcher vs bare httpx loop (same pool size), instant server | "
          f"{disp_rate:,.0f} vs {bare_rate:,.0f} req/s = {disp_rate / bare_rate:.2f} |")
    print(f"| bare loop with one shared client ({conc} in flight) | {naive_rate:,.0f} req/s |")
    print(f"| client CPU per 1,000 completions, instant server | {cpu_per_1000:.2f} s |")
    print(json.dumps({
        "pipeline_efficiency": min(r["efficiency"] for r in rows),
        "dispatch_ratio": round(disp_rate / bare_rate, 3),
        "client_cpu_s_per_1000": round(cpu_per_1000, 3),
        "bare_one_client_req_s": round(naive_rate),
        "by_config": rows,
        "machine": f"{platform.machine()} {platform.python_version()} "
                   f"{len(__import__('os').sched_getaffinity(0))} cores",
    }))


if __name__ == "__main__":
    main()
