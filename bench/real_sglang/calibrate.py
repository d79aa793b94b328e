"""Measure real SGLang on the GPU machine: startup, pools, decode speed vs running requests.

Runs on the device (Python 3.12, the real-SGLang runtime of `../shared/real-sglang` copied to
`.real-sglang/`), with nothing of the project's own environment: the standard library and
httpx only, because the point is to record what SGLang itself does, not what our code makes
of it. For each server configuration it

1. launches `python3 -m sglang.launch_server` through `.real-sglang/run.sh` and times /health;
2. saves the answers of /server_info, /get_server_info, /metrics, /v1/models and /generate as
   fixtures (real bytes, for the parsers and the contract tests in CI);
3. sweeps the number of concurrent requests (1 … the server's own cap, then past it): N
   distinct pre-tokenized prompts of `--input-len` tokens, `--output-len` tokens each with
   `ignore_eos`, while /metrics is sampled once a second; the server's Decode log lines carry
   the decode speed at each #running-req;
4. stops the server and records how long the GPU memory took to come back.

Everything lands in one folder, packed as a .tar.gz after each configuration (the device
returns at most 8 files); `bench/real_sglang/fit.py` turns it into `data/` and the fit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import httpx

RUNTIME = Path(".real-sglang")
COMMON = ["--load-format", "dummy", "--attention-backend", "triton", "--sampling-backend",
          "pytorch", "--grammar-backend", "none", "--enable-metrics", "--host", "127.0.0.1",
          "--decode-log-interval", "20"]


def gpu_used_mib() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=20).stdout
        return int(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def find_key(body: Any, key: str) -> Any:
    """First value of `key` anywhere in a JSON body (internal_states first)."""
    if isinstance(body, dict):
        for inner in body.get("internal_states") or []:
            found = find_key(inner, key)
            if found is not None:
                return found
        if body.get(key) is not None:
            return body[key]
        for value in body.values():
            found = find_key(value, key)
            if found is not None:
                return found
    if isinstance(body, list):
        for value in body:
            found = find_key(value, key)
            if found is not None:
                return found
    return None


def parse_gauges(text: str) -> dict[str, float]:
    """sglang:* gauge values from Prometheus text (first sample of each name)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("sglang:") or " " not in line:
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        try:
            values.setdefault(name, float(line.rsplit(" ", 1)[1]))
        except ValueError:
            continue
    return values


class Server:
    """One real SGLang server process with its log."""

    def __init__(self, name: str, model: str, flags: list[str], port: int, work: Path) -> None:
        self.name, self.port, self.work = name, port, work
        self.url = f"http://127.0.0.1:{port}"
        self.argv = ["bash", str(RUNTIME / "run.sh"), "python3", "-m", "sglang.launch_server",
                     "--model-path", str(RUNTIME / "models" / model), *COMMON,
                     "--port", str(port), *flags]
        self.log_path = work / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float) -> float:
        log = self.log_path.open("wb")
        started = time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        while time.monotonic() - started < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: exited {self.proc.returncode} during startup")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name}: not healthy after {timeout_s:.0f} s")

    def stop(self) -> dict[str, Any]:
        before = gpu_used_mib()
        started = time.monotonic()
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        exited = time.monotonic() - started
        while (gpu_used_mib() or 0) > 1024 and time.monotonic() - started < 60:
            time.sleep(0.5)
        return {"gpu_used_mib_before_stop": before, "process_exit_s": round(exited, 2),
                "memory_released_s": round(time.monotonic() - started, 2),
                "gpu_used_mib_after_stop": gpu_used_mib()}


def capture_fixtures(server: Server, work: Path, tokenized: bool) -> dict[str, Any]:
    """Save the raw answers of the endpoints the pipeline reads."""
    saved: dict[str, Any] = {}
    for path in ("/server_info", "/get_server_info", "/v1/models", "/metrics", "/health"):
        resp = httpx.get(f"{server.url}{path}", timeout=30)
        name = path.strip("/").replace("/", "_") or "root"
        suffix = "txt" if path == "/metrics" else "json"
        (work / f"{server.name}.{name}.{suffix}").write_bytes(resp.content)
        saved[path] = resp.status_code
    body: dict[str, Any] = {"sampling_params": {"max_new_tokens": 8, "temperature": 0,
                                                "ignore_eos": True}}
    if tokenized:
        body["input_ids"] = [random.randrange(3, 240000) for _ in range(16)]
    else:
        body["text"] = "The capital of France is"
    resp = httpx.post(f"{server.url}/generate", json=body, timeout=120)
    (work / f"{server.name}.generate.json").write_bytes(resp.content)
    saved["/generate"] = resp.status_code
    return saved


async def sample_metrics(url: str, samples: list[dict[str, Any]], stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(timeout=5) as client:
        while not stop.is_set():
            try:
                text = (await client.get(f"{url}/metrics")).text
                samples.append({"t": time.time(), **parse_gauges(text)})
            except httpx.HTTPError:
                pass
            await asyncio.sleep(1.0)


async def one_level(url: str, n: int, input_len: int, output_len: int,
                    vocab: int) -> dict[str, Any]:
    """N concurrent requests; per-request latency and meta_info, /metrics once a second."""
    rng = random.Random(n)
    prompts = [[rng.randrange(3, vocab) for _ in range(input_len)] for _ in range(n)]
    samples: list[dict[str, Any]] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_metrics(url, samples, stop))
    limits = httpx.Limits(max_connections=n + 8, max_keepalive_connections=n + 8)
    started = time.time()
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def send(ids: list[int]) -> dict[str, Any]:
            t0 = time.time()
            resp = await client.post(f"{url}/generate", json={
                "input_ids": ids, "sampling_params": {
                    "max_new_tokens": output_len, "temperature": 0, "ignore_eos": True}})
            resp.raise_for_status()
            meta = resp.json().get("meta_info", {})
            return {"start": t0, "end": time.time(),
                    "prompt_tokens": meta.get("prompt_tokens"),
                    "completion_tokens": meta.get("completion_tokens"),
                    "cached_tokens": meta.get("cached_tokens"),
                    "e2e_latency": meta.get("e2e_latency")}

        requests = await asyncio.gather(*(send(p) for p in prompts))
    ended = time.time()
    stop.set()
    await sampler
    out_tokens = sum(r["completion_tokens"] or 0 for r in requests)
    return {"n": n, "input_len": input_len, "output_len": output_len, "start": started,
            "end": ended, "wall_s": round(ended - started, 3), "output_tokens": out_tokens,
            "client_tok_s": round(out_tokens / (ended - started), 1),
            "requests": requests, "metrics": samples}


def levels_for(cap: int, extra: list[int]) -> list[int]:
    base = [1, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512]
    chosen = sorted({n for n in base if n < cap} | {cap} | {n for n in extra if n > 0})
    return chosen


def pack(work: Path, out: Path) -> None:
    with tarfile.open(out / f"{work.name}.tar.gz", "w:gz") as tar:
        tar.add(work, arcname=work.name)


def run_config(cfg: dict[str, Any], args: argparse.Namespace, work: Path,
               deadline: float) -> dict[str, Any]:
    server = Server(cfg["name"], cfg["model"], cfg["flags"], args.port, work)
    record: dict[str, Any] = {"name": cfg["name"], "model": cfg["model"], "flags": cfg["flags"],
                              "argv": server.argv, "gpu_used_mib_idle": gpu_used_mib()}
    try:
        record["startup_s"] = round(server.start(min(360.0, deadline - time.monotonic())), 2)
        record["fixtures"] = capture_fixtures(server, work, cfg.get("tokenized", True))
        info = json.loads((work / f"{cfg['name']}.server_info.json").read_text())
        # 0.5.17 keeps the requested value (null) under max_running_requests and the
        # effective cap under effective_max_running_requests_per_dp.
        cap = int(find_key(info, "effective_max_running_requests_per_dp")
                  or find_key(info, "max_running_requests"))
        record["max_running_requests"] = cap
        record["max_total_num_tokens"] = find_key(info, "max_total_num_tokens")
        record["gpu_used_mib_loaded"] = gpu_used_mib()
        record["levels"] = []
        levels = cfg.get("levels") or levels_for(cap, cfg.get("extra_levels", []))
        for n in [cap if n == "cap" else n for n in levels]:
            if time.monotonic() > deadline - cfg.get("reserve_s", 25):
                record["levels_skipped_from"] = n
                break
            level = asyncio.run(one_level(server.url, n, args.input_len, args.output_len,
                                          cfg.get("vocab", 240000)))
            record["levels"].append(level)
            print(f"{cfg['name']}: n={n} {level['client_tok_s']} tok/s "
                  f"({level['wall_s']} s)", flush=True)
        (work / f"{cfg['name']}.metrics_loaded.txt").write_text(
            httpx.get(f"{server.url}/metrics", timeout=30).text)
    except Exception as exc:  # record and move on: the next config may still run
        record["error"] = f"{type(exc).__name__}: {exc}"
        print(f"{cfg['name']}: {record['error']}", flush=True)
    finally:
        record["stop"] = server.stop()
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--configs", required=True, help="JSON file: a list of configs")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--name", default="calibration")
    parser.add_argument("--budget-s", type=float, default=540)
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--port", type=int, default=30000)
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget_s
    work = Path("/tmp") / args.name
    work.mkdir(parents=True, exist_ok=True)
    configs = json.loads(Path(args.configs).read_text())
    results = []
    for cfg in configs:
        if time.monotonic() > deadline - cfg.get("needs_s", 120):
            results.append({"name": cfg["name"], "skipped": "device time budget"})
            continue
        results.append(run_config(cfg, args, work, deadline))
        (work / "results.json").write_text(json.dumps(results, indent=1))
        pack(work, args.out)
    (work / "results.json").write_text(json.dumps(results, indent=1))
    pack(work, args.out)


if __name__ == "__main__":
    main()
