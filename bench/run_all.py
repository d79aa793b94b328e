"""The pipeline's own speed: does the client keep the (simulated) GPUs busy?

    python bench/run_all.py [--repeats 3] [--quick]

1. pipeline efficiency: achieved tok/s (modeled GPU time) ÷ the simulator's analytic maximum
   for the config, for 2, 8 and 32 simulated servers and two time scales;
2. dispatcher throughput against an instant server, relative to a bare async httpx loop on
   the same server, and client CPU seconds per 1,000 completions.
Medians of --repeats runs; ends with one JSON line (`pipeline_efficiency` is the lowest
across configurations).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
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


def pipeline_run(servers: int, time_scale: float, prompts: int) -> float:
    """Achieved / analytic for one run of the generate pipeline (no Prefect: the dispatcher,
    commits and servers are what is measured)."""
    from flows.settings import load_settings
    from infra.sim.text import count_prompt_tokens
    from tasks.capacity import measure_fleet
    from tasks.health import wait_until_healthy
    from tasks.servers import build_launch_specs, launch_fleet, registry_for, stop_fleet
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
        handles = launch_fleet(build_launch_specs(settings, out), registry_for(out), "b", 5.0)
        try:
            wait_until_healthy(handles, None, 120.0)
            caps = measure_fleet(handles, None)
            commits: list[tuple[float, int]] = []
            generate_pending(settings, state, caps,
                             on_commit=lambda e: commits.append((time.monotonic(),
                                                                 e.output_tokens)))
        finally:
            stop_fleet(handles, registry_for(out), 5.0)
    # Steady state: the commits between 20 % and 80 % of the job's tokens (ramp-up and the
    # final drain of a finite job are not the pipeline's speed).
    total = sum(t for _, t in commits)
    done, lo, hi = 0, None, None
    for when, tokens in commits:
        done += tokens
        if lo is None and done >= 0.2 * total:
            lo = (when, done)
        if hi is None and done >= 0.8 * total:
            hi = (when, done)
    assert lo is not None and hi is not None and hi[0] > lo[0]
    achieved = (hi[1] - lo[1]) / (hi[0] - lo[0]) / time_scale
    prompt_tokens = statistics.fmean(count_prompt_tokens(t) for t in texts)
    maximum, _cap = analytic_max_tok_s(servers, prompt_tokens)
    return achieved / maximum


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


def bare_loop(url: str, n: int, concurrency: int) -> float:
    import httpx

    async def main() -> float:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(n):
            queue.put_nowait(i)
        limits = httpx.Limits(max_connections=concurrency + 8)
        async with httpx.AsyncClient(limits=limits) as client:
            async def worker() -> None:
                while not queue.empty():
                    queue.get_nowait()
                    resp = await client.post(f"{url}/generate", json={"text": "x"})
                    resp.json()

            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return n / (time.perf_counter() - t0)

    return asyncio.run(main())


def dispatcher_loop(url: str, n: int, concurrency: int) -> tuple[float, float]:
    from tasks.dispatch import Dispatcher, DispatchOptions, Endpoint

    opts = DispatchOptions("m", None, {"max_new_tokens": 8, "temperature": 0.7, "top_p": 0.9,
                                       "seed": 1}, 30.0, 3, 0.01)

    async def commit(shard: int, rows: list[Any], errors: list[Any]) -> None:
        return None

    shards = [(s, [{"id": f"{s}-{i}", "prompt": "x"} for i in range(100)])
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
    ap.add_argument("--configs", default="2:10,2:40,8:10,32:2",
                    help="servers:time_scale pairs to measure")
    ap.add_argument("--big-repeats", type=int, default=1,
                    help="runs of the 32-server configuration (5+ minutes each here)")
    args = ap.parse_args()
    rows = []
    configs = [(int(a), float(b)) for a, b in (c.split(":") for c in args.configs.split(","))]
    if args.quick:
        configs = [(2, 10.0), (8, 10.0)]
    for servers, scale in configs:
        repeats = args.big_repeats if servers >= 32 else args.repeats
        runs = [pipeline_run(servers, scale, prompts=servers * 52 * 8) for _ in range(repeats)]
        rows.append((servers, scale, statistics.median(runs)))
        print(f"| {servers} servers, time scale {scale:g} | {statistics.median(runs):.3f} |",
              flush=True)

    port = 28900
    server = instant_server_process(port)
    try:
        url = f"http://127.0.0.1:{port}"
        n, conc = 5000, 64
        bare = [bare_loop(url, n, conc) for _ in range(args.repeats)]
        disp = [dispatcher_loop(url, n, conc) for _ in range(args.repeats)]
    finally:
        server.kill()
    bare_rate = statistics.median(bare)
    disp_rate = statistics.median(r for r, _ in disp)
    cpu_per_1000 = statistics.median(c for _, c in disp)
    print(f"| dispatcher vs bare httpx loop, instant server | {disp_rate:,.0f} vs "
          f"{bare_rate:,.0f} req/s = {disp_rate / bare_rate:.2f} |")
    print(f"| client CPU per 1,000 completions | {cpu_per_1000:.2f} s |")
    print(json.dumps({
        "pipeline_efficiency": round(min(r[2] for r in rows), 3),
        "dispatch_ratio": round(disp_rate / bare_rate, 3),
        "client_cpu_s_per_1000": round(cpu_per_1000, 3),
        "by_config": [{"servers": s, "time_scale": t, "efficiency": round(e, 3)}
                      for s, t, e in rows],
        "machine": f"{platform.machine()} {platform.python_version()} "
                   f"{len(__import__('os').sched_getaffinity(0))} cores",
    }))


if __name__ == "__main__":
    main()
