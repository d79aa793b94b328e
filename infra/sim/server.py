"""The simulated SGLang server process: startup log lines, HTTP API, /metrics, faults.

Startup mirrors SGLang: the port is not bound until the pools are sized, /health answers 503
until warmup, and flags that do not fit the GPU end the process with an error line and exit 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import uvicorn
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from infra.sglang.memory import MemoryPlan, PoolsDoNotFit, plan_memory
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.roofline import build_roofline
from infra.sglang.versions import parse_version
from infra.sim.config import SimConfig, parse_sim_args
from infra.sim.engine import SimEngine
from infra.sim.text import EOS_TOKEN_ID, complete, count_prompt_tokens

READY_LINE = "The server is fired up and ready to roll!"


def log(message: str) -> None:
    """One SGLang-format log line on stdout (the launcher sends it to the log file)."""
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    sys.stdout.write(f"[{stamp}] {message}\n")
    sys.stdout.flush()


def fail_start(message: str, kind: str = "ValueError") -> None:
    log("Scheduler hit an exception: Traceback (most recent call last):")
    sys.stdout.write(f"{kind}: {message}\n")
    log("Received sigquit from a child process. It usually means the child failed.")
    sys.stdout.flush()
    os._exit(1)


# Modeled startup (reference §6.3): imports, weight loading from local NVMe, graph capture.
IMPORT_S = 20.0
WEIGHT_LOAD_GIB_S = 2.0
GRAPH_CAPTURE_S = 30.0


def modeled_startup_s(weights_gib: float) -> float:
    """GPU-time seconds a warm-cache SGLang start takes for this much weight."""
    return IMPORT_S + weights_gib / WEIGHT_LOAD_GIB_S + GRAPH_CAPTURE_S


def startup_lines(cfg: SimConfig, plan: MemoryPlan, free_before: float) -> list[str]:
    lines = [f"Load weight begin. avail mem={free_before:.2f} GB"]
    free_after = free_before - plan.weights_gib
    lines.append(
        f"Load weight end. elapsed={plan.weights_gib / WEIGHT_LOAD_GIB_S:.2f} s, "
        f"type=Sim{plan.model.split('/')[-1]}, "
        f"avail mem={free_after:.2f} GB, mem usage={plan.weights_gib:.2f} GB.")
    lines += list(plan.warnings)
    if plan.mamba_cap is not None:
        mamba = (f"Mamba Cache is allocated. max_mamba_cache_size: {plan.mamba_slots}, "
                 f"conv_state size: {plan.conv_state_gib:.2f}GB, "
                 f"ssm_state size: {plan.ssm_state_gib:.2f}GB ")
        if plan.draft_tokens:
            mamba += (f"intermediate_ssm_state_cache size: {plan.intermediate_gib:.2f}GB "
                      f"intermediate_conv_window_cache size: {plan.intermediate_conv_gib:.2f}GB")
        lines.append(mamba)
    half = plan.kv_cache_gib / 2
    lines.append(f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: "
                 f"{plan.max_total_num_tokens}, K size: {half:.2f} GB, V size: {half:.2f} GB")
    pools = plan.kv_cache_gib + plan.conv_state_gib + plan.ssm_state_gib + plan.intermediate_gib
    avail = free_after - pools
    lines.append(f"Memory pool end. avail mem={avail:.2f} GB")
    lines.append(f"Capture target decode CUDA graph begin. This can take up to several minutes. "
                 f"avail mem={avail:.2f} GB")
    lines.append(f"Capture target decode CUDA graph end. elapsed={GRAPH_CAPTURE_S:.2f} s, "
                 f"mem usage=0.50 GB, avail mem={avail - 0.5:.2f} GB.")
    lines.append(
        f"max_total_num_tokens={plan.max_total_num_tokens}, chunked_prefill_size="
        f"{plan.chunked_prefill_size}, max_prefill_tokens=16384, max_running_requests="
        f"{plan.max_running_requests}, context_len={plan.context_len}, "
        f"available_gpu_mem={avail:.2f} GB")
    return lines


class SimServer:
    """State shared by the HTTP handlers."""

    def __init__(self, cfg: SimConfig, plan: MemoryPlan, engine: SimEngine) -> None:
        self.cfg = cfg
        self.plan = plan
        self.engine = engine
        self.ready = False
        self.completed = 0
        self.rng = random.Random(cfg.seed)
        self.started = time.time()
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
        self.label_values = [cfg.model, "unified", "0", "0", "0"]
        gauge = lambda name, doc: Gauge(f"sglang:{name}", doc, labels,  # noqa: E731
                                        registry=self.registry)
        self.gauges = {
            "num_running_reqs": gauge("num_running_reqs", "The number of running requests."),
            "num_queue_reqs": gauge("num_queue_reqs", "The number of requests in the queue."),
            "gen_throughput": gauge("gen_throughput", "The generation throughput (token/s)."),
            "token_usage": gauge("token_usage", "The token usage."),
            "full_token_usage": gauge("full_token_usage", "Full-attention token usage."),
            "num_used_tokens": gauge("num_used_tokens", "The number of used tokens."),
            "max_total_num_tokens": gauge("max_total_num_tokens", "Max total tokens."),
            "context_len": gauge("context_len", "The context length."),
        }
        if plan.mamba_cap is not None:
            self.gauges["mamba_usage"] = gauge("mamba_usage", "Used mamba slots / pool.")
            self.gauges["mamba_used_tokens"] = gauge("mamba_used_tokens", "Used mamba slots.")
            self.gauges["mamba_available_tokens"] = gauge("mamba_available_tokens",
                                                          "Free mamba slots.")
        counter = lambda name, doc: Counter(f"sglang:{name}", doc,  # noqa: E731
                                            ["model_name", "engine_type"],
                                            registry=self.registry)
        self.counters = {
            "prompt_tokens": counter("prompt_tokens", "Number of prefill tokens processed."),
            "generation_tokens": counter("generation_tokens",
                                         "Number of generation tokens processed."),
            "num_requests": counter("num_requests", "Number of requests processed."),
        }
        self._counted = {"prompt_tokens": 0, "generation_tokens": 0, "num_requests": 0}

    # --- auth and faults -------------------------------------------------------------
    def authorized(self, request: Request) -> bool:
        if not self.cfg.api_key:
            return True
        return request.headers.get("authorization") == f"Bearer {self.cfg.api_key}"

    async def maybe_fault(self, request: Request) -> Response | None:
        f = self.cfg.faults
        roll = self.rng.random()
        if roll < f.error_rate:
            return JSONResponse({"error": {"message": "simulated internal error"}},
                                status_code=500)
        if roll < f.error_rate + f.reset_rate:
            reset_connection(request)
            await asyncio.sleep(3600)  # the connection is gone; nothing will be sent
        if roll < f.error_rate + f.reset_rate + f.hang_rate:
            await asyncio.sleep(3600)
        return None

    async def _run_unless_abandoned(self, prompt_tokens: int, target: int,
                                    request: Request | None) -> None:
        """Like SGLang, a request whose client went away is aborted and frees its slots."""
        job = asyncio.ensure_future(self.engine.submit(prompt_tokens, target))
        while True:
            done, _ = await asyncio.wait({job}, timeout=0.5)
            if done:
                job.result()
                return
            if request is not None and await request.is_disconnected():
                job.cancel()
                raise asyncio.CancelledError

    def after_completion(self) -> None:
        self.completed += 1
        limit = self.cfg.faults.crash_after_requests
        if limit is not None and self.completed >= limit:
            log("Scheduler hit an exception: simulated crash (fault injection)")
            os._exit(1)

    # --- generation ------------------------------------------------------------------
    async def generate_one(self, prompt: str | list[int], sampling: dict[str, Any],
                           request: Request | None = None) -> dict[str, Any]:
        """One completion; `prompt` is text, or token ids (what SGLang calls input_ids)."""
        prompt_tokens = (len(prompt) if isinstance(prompt, list)
                         else count_prompt_tokens(prompt))
        max_new = int(sampling.get("max_new_tokens") or 128)
        if prompt_tokens + max_new > self.plan.context_len:
            raise ValueError(
                f"Requested token count exceeds the model's maximum context length of "
                f"{self.plan.context_len} tokens. You requested a total of "
                f"{prompt_tokens + max_new} tokens: {prompt_tokens} tokens from the input "
                f"messages and {max_new} tokens for the completion.")
        result = complete(prompt if isinstance(prompt, str) else json.dumps(prompt), sampling,
                          self.cfg.seed)
        started = time.monotonic()
        await self._run_unless_abandoned(prompt_tokens, result.completion_tokens, request)
        latency = time.monotonic() - started
        self.after_completion()
        finish: dict[str, Any] = ({"type": "stop", "matched": EOS_TOKEN_ID}
                                  if result.finish_reason == "stop"
                                  else {"type": "length", "length": result.completion_tokens})
        text = {} if self.cfg.skip_tokenizer_init else {"text": result.text}
        return {
            **text,
            "output_ids": result.output_ids,
            "meta_info": {
                "id": uuid.uuid4().hex,
                "finish_reason": finish,
                "prompt_tokens": prompt_tokens,
                "completion_tokens": result.completion_tokens,
                "cached_tokens": 0,
                "weight_version": "default",
                "num_retractions": 0,
                "e2e_latency": latency,
            },
        }


def reset_connection(request: Request) -> None:
    """Abort the TCP connection with a RST (SO_LINGER 0), as a crashing peer would.

    Reaches uvicorn's transport through the ASGI receive callable (its request cycle)."""
    import socket
    import struct

    cycle = getattr(getattr(request, "_receive", None), "__self__", None)
    transport = getattr(cycle, "transport", None)
    if transport is None:
        raise ConnectionResetError("simulated connection reset")
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _generate_prompt(body: dict[str, Any] | None,
                     skip_tokenizer_init: bool) -> tuple[str | list[int] | None, str]:
    """The prompt of a native /generate body (text or input_ids), or None and why not."""
    if body is None:
        return None, "request body must be a JSON object"
    ids = body.get("input_ids")
    if ids is not None:
        if (not isinstance(ids, list) or not ids
                or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids)):
            return None, "`input_ids` must be a non-empty list of token ids (integers)"
        return ids, ""
    if skip_tokenizer_init:
        return None, ("`input_ids` is required: the server runs with --skip-tokenizer-init "
                      "and has no tokenizer for `text`")
    if not isinstance(body.get("text"), str):
        return None, "`text` (a string) or `input_ids` is required"
    return body["text"], ""


def _bad_request(message: str, openai: bool) -> JSONResponse:
    if openai:
        return JSONResponse({"object": "error", "message": message, "type": "BadRequestError",
                             "param": None, "code": 400}, status_code=400)
    return JSONResponse({"error": {"message": message}}, status_code=400)


def build_app(server: SimServer) -> Starlette:
    cfg = server.cfg

    async def health(request: Request) -> Response:
        return Response(status_code=200 if server.ready else 503)

    async def server_info(request: Request) -> Response:
        if not server.authorized(request):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return JSONResponse(server_info_body(server))

    async def model_info(request: Request) -> Response:
        return JSONResponse({"model_path": cfg.model, "tokenizer_path": cfg.model,
                             "is_generation": True, "model_type": "sim",
                             "architectures": ["SimForCausalLM"], "weight_version": "default"})

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": cfg.model, "object": "model", "created": int(server.started),
             "owned_by": "sglang", "root": cfg.model, "max_model_len": server.plan.context_len}]})

    async def metrics(request: Request) -> Response:
        if not cfg.flags.enable_metrics:
            return PlainTextResponse("Not Found", status_code=404)
        update_metrics(server)
        return Response(generate_latest(server.registry),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    async def read_json(request: Request) -> dict[str, Any] | None:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
        return body if isinstance(body, dict) else None

    async def generate(request: Request) -> Response:
        if not server.authorized(request):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        if not server.ready:
            return JSONResponse({"error": {"message": "server not ready"}}, status_code=503)
        body = await read_json(request)
        prompt, problem = _generate_prompt(body, cfg.skip_tokenizer_init)
        if prompt is None:
            return _bad_request(problem, openai=False)
        fault = await server.maybe_fault(request)
        if fault is not None:
            return fault
        sampling = dict((body or {}).get("sampling_params") or {})
        try:
            out = await server.generate_one(prompt, sampling, request)
        except ValueError as exc:
            return _bad_request(str(exc), openai=False)
        return JSONResponse(out)

    async def openai(request: Request, chat: bool) -> Response:
        if not server.authorized(request):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        body = await read_json(request)
        if body is None:
            return _bad_request("request body must be a JSON object", openai=True)
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                return _bad_request("`messages` must be a non-empty list", openai=True)
            prompt = "".join(f"<|im_start|>{m.get('role')}\n{m.get('content')}<|im_end|>\n"
                             for m in msgs if isinstance(m, dict))
        else:
            raw = body.get("prompt")
            if not isinstance(raw, str):
                return _bad_request("`prompt` (a string) is required", openai=True)
            prompt = raw
        fault = await server.maybe_fault(request)
        if fault is not None:
            return fault
        sampling = {"max_new_tokens": body.get("max_tokens") or body.get("max_completion_tokens")
                    or 128, "temperature": body.get("temperature", 1.0),
                    "top_p": body.get("top_p", 1.0)}
        if body.get("seed") is not None:
            sampling["sampling_seed"] = body["seed"]
        try:
            out = await server.generate_one(prompt, sampling, request)
        except ValueError as exc:
            return _bad_request(str(exc), openai=True)
        meta = out["meta_info"]
        reason = meta["finish_reason"]["type"]
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason,
                                  "matched_stop": EOS_TOKEN_ID if reason == "stop" else None}
        if chat:
            choice["message"] = {"role": "assistant", "content": out["text"],
                                 "reasoning_content": None, "tool_calls": None}
        else:
            choice["text"] = out["text"]
        return JSONResponse({
            "id": meta["id"], "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": cfg.model, "choices": [choice],
            "usage": {"prompt_tokens": meta["prompt_tokens"],
                      "completion_tokens": meta["completion_tokens"],
                      "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"]},
        })

    async def completions(request: Request) -> Response:
        return await openai(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await openai(request, chat=True)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        loop_task = asyncio.create_task(server.engine.run())
        warm = asyncio.create_task(warmup(server))
        yield
        warm.cancel()
        loop_task.cancel()

    routes = [
        Route("/health", health), Route("/health_generate", health),
        Route("/get_server_info", server_info), Route("/server_info", server_info),
        Route("/model_info", model_info), Route("/get_model_info", model_info),
        Route("/v1/models", models), Route("/metrics", metrics),
        Route("/generate", generate, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


async def warmup(server: SimServer) -> None:
    await server.engine.submit(4, 1)
    server.ready = True
    log(READY_LINE)


def server_info_body(server: SimServer) -> dict[str, Any]:
    cfg, plan = server.cfg, server.plan
    args: dict[str, Any] = {
        "model_path": cfg.model, "tokenizer_path": cfg.model, "host": cfg.host,
        "port": cfg.port, "api_key": None if cfg.api_key is None else "***",
        **cfg.flags.model_dump(exclude={"extra_args", "mamba_strategy"}),
        "mamba_radix_cache_strategy": cfg.flags.mamba_strategy,
        "served_model_name": cfg.model, "decode_log_interval": cfg.decode_log_interval,
    }
    internal = {
        **args,
        "mem_fraction_static": plan.mem_fraction_static,
        "max_mamba_cache_size": plan.mamba_slots if plan.mamba_cap is not None else None,
        "max_running_requests": plan.max_running_requests,
        "last_gen_throughput": server.engine.stats.gen_throughput,
        "memory_usage": {"weight": plan.weights_gib, "kvcache": plan.kv_cache_gib,
                         "token_capacity": plan.max_total_num_tokens, "graph": 0.5},
        "effective_max_running_requests_per_dp": plan.max_running_requests,
    }
    return {**args, "status": "ready", "max_total_num_tokens": plan.max_total_num_tokens,
            "max_req_input_len": plan.max_total_num_tokens - 6,
            "internal_states": [internal], "version": cfg.version}


def update_metrics(server: SimServer) -> None:
    eng, lv = server.engine, server.label_values
    stats = eng.stats
    kv = eng.kv_usage()
    mamba = eng.mamba_usage()
    g = server.gauges
    g["num_running_reqs"].labels(*lv).set(stats.running)
    g["num_queue_reqs"].labels(*lv).set(stats.queued)
    g["gen_throughput"].labels(*lv).set(stats.gen_throughput)
    g["full_token_usage"].labels(*lv).set(round(kv, 2))
    g["token_usage"].labels(*lv).set(round(max(kv, mamba or 0.0), 2))
    g["num_used_tokens"].labels(*lv).set(stats.kv_used_tokens)
    g["max_total_num_tokens"].labels(*lv).set(server.plan.max_total_num_tokens)
    g["context_len"].labels(*lv).set(server.plan.context_len)
    if mamba is not None:
        g["mamba_usage"].labels(*lv).set(round(mamba, 2))
        g["mamba_used_tokens"].labels(*lv).set(stats.mamba_used)
        g["mamba_available_tokens"].labels(*lv).set(server.plan.mamba_slots - stats.mamba_used)
    totals = {"prompt_tokens": stats.prompt_tokens_total,
              "generation_tokens": stats.generation_tokens_total,
              "num_requests": stats.requests_total}
    for name, total in totals.items():
        delta = total - server._counted[name]
        if delta > 0:
            server.counters[name].labels(lv[0], lv[1]).inc(delta)
            server._counted[name] = total


def main(argv: list[str] | None = None) -> None:
    try:
        cfg = parse_sim_args(sys.argv[1:] if argv is None else argv)
    except (ValueError, OSError, yaml.YAMLError) as exc:
        print(f"ValueError: {exc}", file=sys.stderr, flush=True)  # SGLang: a traceback, exit 1
        raise SystemExit(1) from exc
    # Like SGLang, the startup line shows every argument, the API key included: the pipeline
    # must redact its log files (tasks.servers.redact_logs), and tests check that it does.
    log(f"server_args=ServerArgs(model_path={cfg.model!r}, host={cfg.host!r}, port={cfg.port}, "
        f"api_key={cfg.api_key!r}, sim_gpu={cfg.gpu!r}, sim_time_scale={cfg.time_scale})")
    try:
        model = model_profile(cfg.model, cfg.weights_gib)
        gpu = gpu_profile(cfg.gpu)
    except ValueError as exc:
        fail_start(str(exc))
        return
    free_before = gpu.total_gib - gpu.context_gib
    delay = cfg.faults.start_delay_s
    if delay is None:
        delay = (cfg.startup_s if cfg.startup_s is not None
                 else modeled_startup_s(model.weights_gib) / cfg.time_scale)
    time.sleep(delay / 2)
    try:
        plan = plan_memory(model, gpu, cfg.flags, cfg.version)
    except PoolsDoNotFit as exc:
        fail_start(str(exc))
        return
    oom_above = cfg.faults.oom_above_mem_fraction
    if cfg.faults.fail_start == "oom" or (oom_above is not None
                                          and plan.mem_fraction_static > oom_above):
        fail_start(f"CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                   f"of {gpu.total_mib / 1024:.2f} GiB", kind="torch.OutOfMemoryError")
    if cfg.faults.fail_start == "error":
        fail_start("simulated startup failure (fault injection)", kind="RuntimeError")
    for line in startup_lines(cfg, plan, free_before):
        log(line)
    time.sleep(delay / 2)
    roofline = build_roofline(model, gpu, cfg.flags, plan, cfg.accept_len)
    prefix_state = (parse_version(cfg.version).locks_prefix_state
                    and not cfg.flags.disable_radix_cache)
    engine = SimEngine(plan, roofline, cfg.time_scale, log, cfg.decode_log_interval,
                       prefix_state)
    server = SimServer(cfg, plan, engine)
    uvicorn.run(build_app(server), host=cfg.host, port=cfg.port, log_level="warning",
                access_log=False, timeout_graceful_shutdown=30)


if __name__ == "__main__":
    main()
