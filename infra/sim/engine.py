"""Continuous batching limited by both pools, paced by the roofline in modeled GPU time.

Requests wait in a FIFO queue; a request runs when a request slot, its mamba slots (ρ per
running request) and KV room for its prompt are free. Each loop iteration advances all running
requests by a chunk of decode steps, sleeping the modeled time divided by the time scale.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from infra.sglang.memory import MemoryPlan
from infra.sglang.roofline import Roofline
from infra.sim.metrics import RequestLatencies

# The shortest wall-clock sleep per loop iteration: keeps the loop cheap at high time scales.
MIN_WALL_CHUNK_S = 0.004


@dataclass
class SimRequest:
    prompt_tokens: int
    target_tokens: int
    future: asyncio.Future[float]
    generated: float = 0.0
    arrival: float = field(default_factory=time.monotonic)
    arrived_at: float = 0.0  # modeled clock: queued, admitted, first token
    admitted_at: float | None = None
    first_token_at: float | None = None


@dataclass
class EngineStats:
    """What /metrics and the log lines report."""

    running: int = 0
    queued: int = 0
    kv_used_tokens: int = 0
    mamba_used: int = 0
    gen_throughput: float = 0.0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    requests_total: int = 0
    decode_steps: int = 0


def tracking_slots(strategy: str, overlap: bool, prefix_state: bool = False) -> int:
    """Live states a running request holds under load, as `mamba num` counts them: 1 working
    + ping-pong copies (reference §2.5), + 1 when the build keeps the request's prefix state
    locked in the radix tree while it runs. SGLang 0.5.17 on the H200 showed exactly 2 per
    request under no_buffer and 4 under extra_buffer (bench/real_sglang/fit.py); seed 000's
    older build showed 3 under extra_buffer."""
    if strategy == "extra_buffer":
        live = 3 if overlap else 2
    elif strategy == "extra_buffer_lazy":
        live = 2
    else:
        live = 1
    return live + (1 if prefix_state else 0)


class SimEngine:
    """The scheduler loop. `submit` returns the finished request (its modeled times)."""

    def __init__(self, plan: MemoryPlan, roofline: Roofline, time_scale: float,
                 log: Callable[[str], None], decode_log_interval: int = 40,
                 prefix_state: bool = False, max_chunk_steps: int | None = None) -> None:
        self.plan = plan
        self.roofline = roofline
        self.time_scale = time_scale
        self.log = log
        self.decode_log_interval = decode_log_interval
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.stats = EngineStats()
        self._wake = asyncio.Event()
        self._slots_per_request = tracking_slots(plan.mamba_strategy, plan.overlap_schedule,
                                                 prefix_state)
        self._window_tokens = 0.0
        self._window_time = 0.0
        self._modeled_clock = 0.0
        self._anchor: tuple[float, float] | None = None  # (wall, modeled clock) pacing origin
        self.latencies = RequestLatencies()
        # Steps advanced per loop iteration at most. Unbounded, high time scales batch many
        # steps per wall-clock wake-up, and requests that arrive meanwhile wait for the chunk;
        # SGLang admits them at its next step (an exact replay sets 1).
        self.max_chunk_steps = max_chunk_steps

    async def submit(self, prompt_tokens: int, target_tokens: int) -> SimRequest:
        loop = asyncio.get_running_loop()
        req = SimRequest(prompt_tokens, target_tokens, loop.create_future(),
                         arrived_at=self._modeled_clock)
        self.waiting.append(req)
        self.stats.queued = len(self.waiting)
        self._wake.set()
        await req.future
        return req

    def _kv_used(self) -> int:
        return sum(r.prompt_tokens + int(r.generated) for r in self.running)

    def _admit(self) -> int:
        """Move waiting requests into the running batch; return prompt tokens to prefill."""
        plan = self.plan
        kv_used = self._kv_used()
        prefill = 0
        mamba_limit = plan.mamba_slots if plan.mamba_cap is not None else math.inf
        while self.waiting and len(self.running) < plan.max_running_requests:
            nxt = self.waiting[0]
            if nxt.future.cancelled():
                self.waiting.popleft()
                continue
            if kv_used + nxt.prompt_tokens + 1 > plan.max_total_num_tokens:
                break
            if (len(self.running) + 1) * self._slots_per_request > mamba_limit:
                break
            self.waiting.popleft()
            nxt.admitted_at = self._modeled_clock
            self.running.append(nxt)
            kv_used += nxt.prompt_tokens
            prefill += nxt.prompt_tokens
        return prefill

    async def _sleep_modeled(self, modeled: float) -> None:
        """Sleep so that wall time tracks modeled time / time_scale *cumulatively*: the
        overshoot of each sleep is made up by the next, so the simulated GPU does not run
        slower than its roofline at high time scales."""
        if self._anchor is None:
            self._anchor = (time.monotonic(), self._modeled_clock)
        target = self._anchor[0] + (self._modeled_clock + modeled - self._anchor[1]) / (
            self.time_scale)
        await asyncio.sleep(max(0.0, target - time.monotonic()))

    async def run(self) -> None:
        while True:
            if not self.running and not self.waiting:
                self._publish(idle=True)
                self._wake.clear()
                await self._wake.wait()
                self._anchor = None  # idle time is not owed to anyone
            prefill = self._admit()
            if prefill:
                self._log_prefill(prefill)
            modeled = self.roofline.prefill_s(prefill) if prefill else 0.0
            if not self.running:
                await asyncio.sleep(max(modeled / self.time_scale, MIN_WALL_CHUNK_S))
                self._anchor = None
                continue
            n = len(self.running)
            avg_ctx = self._kv_used() / n
            step = self.roofline.decode_step_s(n, avg_ctx)
            accept = self.roofline.accept_len
            to_finish = min(math.ceil((r.target_tokens - r.generated) / accept)
                            for r in self.running)
            min_steps = math.ceil(MIN_WALL_CHUNK_S * self.time_scale / step)
            chunk = max(1, min(to_finish, min_steps, self.max_chunk_steps or min_steps))
            first_token = self._modeled_clock + modeled + step  # after the prefill, 1 step
            modeled += chunk * step
            await self._sleep_modeled(modeled)
            self._advance(chunk, accept, modeled, first_token)

    def _advance(self, chunk: int, accept: float, modeled: float, first_token: float) -> None:
        produced = 0.0
        still: list[SimRequest] = []
        self._modeled_clock += modeled
        for req in self.running:
            before = req.generated
            if req.first_token_at is None:
                req.first_token_at = first_token
            req.generated = min(float(req.target_tokens), req.generated + chunk * accept)
            produced += req.generated - before
            if req.generated >= req.target_tokens:
                self.stats.prompt_tokens_total += req.prompt_tokens
                self.stats.generation_tokens_total += req.target_tokens
                self.stats.requests_total += 1
                self._record(req)
                if not req.future.done():
                    req.future.set_result(self._modeled_clock)
            elif req.future.cancelled():
                continue  # client went away: SGLang aborts the request and frees its slots
            else:
                still.append(req)
        before_steps = self.stats.decode_steps
        self.stats.decode_steps += chunk
        self._window_tokens += produced
        self._window_time += modeled
        self._publish()
        crossed = (self.stats.decode_steps // self.decode_log_interval
                   > before_steps // self.decode_log_interval)
        if crossed:
            self.stats.gen_throughput = self._window_tokens / max(self._window_time, 1e-9)
            self._log_decode()
            self._window_tokens = self._window_time = 0.0
        self.running = still
        self._publish()

    def _record(self, req: SimRequest) -> None:
        admitted = req.admitted_at if req.admitted_at is not None else req.arrived_at
        first = req.first_token_at if req.first_token_at is not None else self._modeled_clock
        self.latencies.record(queued_s=admitted - req.arrived_at,
                              ttft_s=first - req.arrived_at,
                              e2e_s=self._modeled_clock - req.arrived_at,
                              tokens=req.target_tokens)

    def _publish(self, idle: bool = False) -> None:
        s = self.stats
        s.running = len(self.running)
        s.queued = len(self.waiting)
        s.kv_used_tokens = self._kv_used()
        s.mamba_used = s.running * self._slots_per_request
        if idle:
            s.gen_throughput = 0.0

    def kv_usage(self) -> float:
        return self.stats.kv_used_tokens / self.plan.max_total_num_tokens

    def mamba_usage(self) -> float | None:
        if self.plan.mamba_cap is None:
            return None
        return self.stats.mamba_used / max(1, self.plan.mamba_slots)

    def _usage_part(self, decode: bool) -> str:
        mamba = self.mamba_usage()
        if mamba is None:
            return (f"#token: {self.stats.kv_used_tokens}, token usage: {self.kv_usage():.2f}"
                    if decode else f"token usage: {self.kv_usage():.2f}")
        if decode:
            return (f"#full token: {self.stats.kv_used_tokens}, full token usage: "
                    f"{self.kv_usage():.2f}, mamba num: {self.stats.mamba_used}, "
                    f"mamba usage: {mamba:.2f}")
        return f"full token usage: {self.kv_usage():.2f}, mamba usage: {mamba:.2f}"

    def _log_prefill(self, tokens: int) -> None:
        self._publish()
        pending = sum(r.prompt_tokens for r in self.waiting)
        throughput = tokens / max(self.roofline.prefill_s(tokens), 1e-9)
        self.log(
            f"Prefill batch, #new-seq: {self._last_admitted()}, #new-token: {tokens}, "
            f"#cached-token: 0, {self._usage_part(decode=False)}, "
            f"#running-req: {self.stats.running}, #queue-req: {self.stats.queued}, "
            f"#pending-token: {pending}, cuda graph: False, "
            f"input throughput (token/s): {throughput:.2f}")

    def _last_admitted(self) -> int:
        return sum(1 for r in self.running if r.generated == 0)

    def _log_decode(self) -> None:
        spec = ""
        if self.plan.draft_tokens:
            accept = self.roofline.accept_len
            rate = (accept - 1) / max(1, self.plan.draft_tokens - 1)
            spec = f"accept len: {accept:.2f}, accept rate: {rate:.2f}, "
        graph = len(self.running) <= self.plan.graph_max_bs
        self.log(
            f"Decode batch, #running-req: {len(self.running)}, {self._usage_part(decode=True)}, "
            f"{spec}cuda graph: {graph}, gen throughput (token/s): "
            f"{self.stats.gen_throughput:.2f}, #queue-req: {len(self.waiting)}")
