"""The simulated SGLang server process: startup log lines, HTTP API, /metrics (its faults:
infra/sim/failures.py).

Startup mirrors SGLang: the port is not bound until the pools are sized, /health answers 503
until warmup, and flags that do not fit the GPU end the process with an error line and exit 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from infra.sglang.memory import MemoryPlan, PoolsDoNotFit, plan_memory
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.roofline import build_roofline
from infra.sglang.versions import parse_version
from infra.sim import openai_api
from infra.sim.config import SimConfig, parse_sim_args
from infra.sim.constrained import output_controls
from infra.sim.failures import Failures
from infra.sim.metrics import Snapshot
from infra.sim.metrics import render as render_metrics
from infra.sim.native_api import bad_request, generate_prompts, generate_refusal
from infra.sim.prefix_cache import PrefixCache, token_bytes
from infra.sim.scheduler import SchedulerOptions, SimRequest, SimScheduler
from infra.sim.startup import (
    IMPORT_S,
    READY_LINE,
    WEIGHT_LOAD_GIB_S,
    degraded_speed,
    fail_start,
    first_start_here,
    injected_start_failure,
    log,
    modeled_startup_s,
    refused_backend,
    startup_lines,
)
from infra.sim.text import EOS_TOKEN_ID, complete, count_prompt_tokens


class SimServer:
    """State shared by the HTTP handlers."""

    def __init__(self, cfg: SimConfig, plan: MemoryPlan, scheduler: SimScheduler,
                 vocab_size: int | None = None, eos_token_ids: tuple[int, ...] = ()) -> None:
        self.cfg = cfg
        # the token an answer that stops on EOS matched: the model's own (a built-in profile
        # names none: Qwen's <|im_end|>, the tokenizer of every built-in)
        self.eos_token_id = eos_token_ids[0] if eos_token_ids else EOS_TOKEN_ID
        self.plan = plan
        self.scheduler = scheduler
        self.failures = Failures(cfg.faults, cfg.seed, vocab_size)
        self.ready = False
        self.started = time.time()
        self.startup_phases: dict[str, float] = {}

    # --- auth and faults -------------------------------------------------------------
    def authorized(self, request: Request) -> bool:
        if not self.cfg.api_key:
            return True
        return request.headers.get("authorization") == f"Bearer {self.cfg.api_key}"

    async def _run_unless_abandoned(self, prompt: str | list[int], prompt_tokens: int,
                                    target: int, max_new: int,
                                    request: Request | None) -> SimRequest:
        """Like SGLang, a request whose client went away is aborted and frees its slots."""
        job = asyncio.ensure_future(self.scheduler.submit(prompt_tokens, target, max_new,
                                                       token_bytes(prompt)))
        while True:
            done, _ = await asyncio.wait({job}, timeout=0.5)
            if done:
                return job.result()
            if request is not None and await request.is_disconnected():
                job.cancel()
                raise asyncio.CancelledError

    # --- generation ------------------------------------------------------------------
    async def generate_one(self, prompt: str | list[int], sampling: dict[str, Any],
                           request: Request | None = None) -> dict[str, Any]:
        """One completion; `prompt` is text, or token ids (what SGLang calls input_ids)."""
        if isinstance(prompt, list):
            self.failures.die_on_unknown_token(prompt)
        else:
            self.failures.die_on_poison(prompt)
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
                          self.cfg.seed, self.cfg.output_lengths)
        received, started = time.time(), time.monotonic()
        req = await self._run_unless_abandoned(prompt, prompt_tokens, result.completion_tokens,
                                               max_new, request)
        latency = time.monotonic() - started
        self.failures.after_completion()
        matched = (result.matched_stop if result.matched_stop is not None
                   else self.eos_token_id)
        finish: dict[str, Any] = ({"type": "stop", "matched": matched}
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
                "cached_tokens": req.cached_tokens,
                "weight_version": "default",
                "num_retractions": req.retractions,
                "e2e_latency": latency,
                **self._timings(req, received, latency),
            },
        }

    def _timings(self, req: SimRequest, received: float, latency: float) -> dict[str, Any]:
        """SGLang's per-request timestamps (wall clock) from the scheduler's modeled times."""
        scale = self.cfg.time_scale
        admitted = req.admitted_at if req.admitted_at is not None else req.arrived_at
        first = req.first_token_at if req.first_token_at is not None else admitted
        queue_s = (admitted - req.arrived_at) / scale
        prefill_done = received + (first - req.arrived_at) / scale
        decode_s = max(latency - (prefill_done - received), 1e-9)
        return {"forward_entry_time": received, "prefill_finished_time": prefill_done,
                "queue_time": queue_s, "reasoning_tokens": 0, "cached_tokens_details": None,
                "dp_rank": None, "request_received_ts": received,
                "api_server_dispatch_finish_ts": received,
                "request_finished_ts": received + latency,
                "decode_throughput": req.target_tokens / decode_s,
                "response_sent_to_client_ts": received + latency}


class Handlers:
    """The HTTP endpoints, over the state of one simulated server."""

    def __init__(self, server: SimServer) -> None:
        self.server = server
        self.cfg = server.cfg

    async def health(self, request: Request) -> Response:
        return Response(status_code=200 if self.server.ready else 503)

    async def server_info(self, request: Request) -> Response:
        if not self.server.authorized(request):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return JSONResponse(server_info_body(self.server))

    async def model_info(self, request: Request) -> Response:
        return JSONResponse({"model_path": self.cfg.model, "tokenizer_path": self.cfg.model,
                             "is_generation": True, "model_type": "sim",
                             "architectures": ["SimForCausalLM"], "weight_version": "default"})

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.cfg.model, "object": "model", "created": int(self.server.started),
             "owned_by": "sglang", "root": self.cfg.model, "parent": None,
             "max_model_len": self.server.plan.context_len}]})

    async def metrics(self, request: Request) -> Response:
        if not self.cfg.flags.enable_metrics:
            return PlainTextResponse("Not Found", status_code=404)
        return Response(metrics_text(self.server),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    @staticmethod
    async def read_json(request: Request) -> dict[str, Any] | None:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
        return body if isinstance(body, dict) else None

    async def generate(self, request: Request) -> Response:
        if not self.server.authorized(request):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        if not self.server.ready:
            return JSONResponse({"error": {"message": "server not ready"}}, status_code=503)
        body = await self.read_json(request)
        prompts, batch, problem = generate_prompts(body, self.cfg.skip_tokenizer_init)
        problem = problem or generate_refusal(body or {}) or ""
        if prompts is None or problem:
            return bad_request(problem, openai=False)
        fault = await self.server.failures.maybe_fault(request)
        if fault is not None:
            return fault
        try:
            sampling = output_controls(dict((body or {}).get("sampling_params") or {}))
            outs = await asyncio.gather(*(self.server.generate_one(p, sampling, request)
                                          for p in prompts))
        except ValueError as exc:
            return bad_request(str(exc), openai=False)
        return JSONResponse(list(outs) if batch else outs[0])

    async def flush_cache(self, request: Request) -> Response:
        return PlainTextResponse(
            "Cache flushed.\nPlease check backend logs for more details. (When there are "
            "running or waiting requests, the operation will not be performed.)\n")

    async def openai(self, request: Request, chat: bool) -> Response:
        if not self.server.authorized(request):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        body = await self.read_json(request)
        if body is None:
            return bad_request("request body must be a JSON object", openai=True)
        fault = await self.server.failures.maybe_fault(request)
        if fault is not None:
            return fault
        try:
            return await openai_api.respond(body, chat, self.cfg.model, request,
                                            self.server.generate_one)
        except ValueError as exc:
            return bad_request(str(exc), openai=True)

    async def completions(self, request: Request) -> Response:
        return await self.openai(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self.openai(request, chat=True)


def build_app(server: SimServer) -> Starlette:
    h = Handlers(server)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        loop_task = asyncio.create_task(server.scheduler.run())
        warm = asyncio.create_task(warmup(server))
        yield
        warm.cancel()
        loop_task.cancel()

    routes = [
        Route("/health", h.health), Route("/health_generate", h.health),
        Route("/get_server_info", h.server_info), Route("/server_info", h.server_info),
        Route("/model_info", h.model_info), Route("/get_model_info", h.model_info),
        Route("/v1/models", h.models), Route("/metrics", h.metrics),
        Route("/generate", h.generate, methods=["POST"]),
        Route("/flush_cache", h.flush_cache, methods=["GET", "POST"]),
        Route("/v1/completions", h.completions, methods=["POST"]),
        Route("/v1/chat/completions", h.chat_completions, methods=["POST"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


async def warmup(server: SimServer) -> None:
    await server.scheduler.submit(4, 1)
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
        "last_gen_throughput": server.scheduler.stats.gen_throughput,
        "memory_usage": {"weight": plan.weights_gib, "kvcache": plan.kv_cache_gib,
                         "token_capacity": plan.max_total_num_tokens, "graph": 0.5},
        "effective_max_running_requests_per_dp": plan.max_running_requests,
    }
    return {**args, "status": "ready", "max_total_num_tokens": plan.max_total_num_tokens,
            "max_req_input_len": plan.max_total_num_tokens - 6,
            "internal_states": [internal], "version": cfg.version}


def metrics_text(server: SimServer) -> str:
    sched, plan = server.scheduler, server.plan
    st = sched.stats
    return render_metrics(server.cfg.model, Snapshot(
        st, max_total_num_tokens=plan.max_total_num_tokens, context_len=plan.context_len,
        mamba_slots=plan.mamba_slots, hybrid=plan.mamba_cap is not None,
        spec_accept_length=sched.roofline.accept_len if server.cfg.flags.speculative else 0.0,
        startup_phases=server.startup_phases),
        sched.latencies, os.getpid())


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
    refused = refused_backend(model.architecture, cfg.attention_backend)
    if refused:
        fail_start(refused, kind="AssertionError")
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
    first_start = first_start_here(cfg)
    injected = injected_start_failure(cfg.faults, plan.mem_fraction_static, gpu.total_mib,
                                      first_start)
    if injected:
        fail_start(*injected)
    for line in startup_lines(cfg, plan, free_before):
        log(line)
    time.sleep(delay / 2)
    roofline = build_roofline(model, gpu, cfg.flags, plan, cfg.accept_len)
    prefix_state = (parse_version(cfg.version).locks_prefix_state
                    and not cfg.flags.disable_radix_cache)
    cache = PrefixCache(plan.mamba_strategy, plan.max_total_num_tokens,
                        enabled=not cfg.flags.disable_radix_cache)
    scheduler = SimScheduler(plan, roofline, cfg.time_scale, log, SchedulerOptions(
        cfg.decode_log_interval, prefix_state, cache=cache, speed=degraded_speed(cfg, first_start)))
    server = SimServer(cfg, plan, scheduler, model.vocab_size, model.eos_token_ids)
    modeled = delay * cfg.time_scale  # /metrics speaks modeled GPU seconds
    server.startup_phases = {
        "load_weight": model.weights_gib / WEIGHT_LOAD_GIB_S, "kv_cache_allocation": 0.03,
        "scheduler_e2e": modeled, "tokenizer_e2e": modeled + IMPORT_S / 2}
    uvicorn.run(build_app(server), host=cfg.host, port=cfg.port, log_level="warning",
                access_log=False, timeout_graceful_shutdown=30)


if __name__ == "__main__":
    main()
