"""Continuous batching limited by both pools, paced by the roofline in modeled GPU time.

Requests wait in a FIFO queue; a request runs when a request slot, its mamba slots (ρ per
running request) and KV room for it are free. Room is judged as SGLang 0.5.17 does
(schedule_policy.py): the new request's uncached prompt plus all of its max_new_tokens (at
most 4,096), against the free pool less what the running requests are expected to still
write — their remaining max_new_tokens × `new_token_ratio`, a ratio that starts at 0.7 and
decays to 0.098 over 600 decode steps; after one finds no room, none is tried until a request
finishes. That admits more than the pool sustains when outputs run long, and decode then
*retracts*: the requests with the fewest output tokens go to the back of the queue (to be
prefilled again, output included) until the next step fits, and the ratio jumps to what the
rest have written. Held to real runs on the H200 (bench/real_sglang/data/). Prompts reuse
cached prefixes as the mamba strategy allows (infra/sim/prefix_cache.py). Each turn advances
the running requests by decode steps to the next event: served, it sleeps the modeled time /
the time scale; replayed (`run_until_idle`), it runs on.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable

from infra.sglang.memory import MemoryPlan
from infra.sglang.roofline import Roofline
from infra.sim.metrics import INIT_NEW_TOKEN_RATIO, EngineStats, RequestLatencies
from infra.sim.prefix_cache import PrefixCache
from infra.sim.running_set import RunningSet
from infra.sim.scheduler_log import decode_line, prefill_line, retract_line, usage_part
from infra.sim.sim_request import SchedulerOptions, SimRequest, Turn, tracking_slots

__all__ = ["SchedulerOptions", "SimRequest", "SimScheduler", "tracking_slots"]
DEFAULT_OPTIONS = SchedulerOptions()

MIN_WALL_CHUNK_S = 0.004  # the shortest sleep of a turn: cheap turns at high time scales
GATHER_S = 0.002  # an idle scheduler's wait for the rest of a burst of requests
# SGLang's defaults (environ.py, schedule_policy.py): SGLANG_INIT_NEW_TOKEN_RATIO,
# ..._MIN_NEW_TOKEN_RATIO_FACTOR, ..._NEW_TOKEN_RATIO_DECAY_STEPS, ..._RETRACT_DECODE_STEPS,
# SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION.
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14
RATIO_DECAY_PER_STEP = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
RETRACT_DECODE_STEPS = 20


def no_log(_line: str) -> None:
    """The log of a replay: nothing is formatted for it."""


class SimScheduler:
    """The scheduler loop. `submit` returns the finished request (its modeled times)."""

    def __init__(self, plan: MemoryPlan, roofline: Roofline, time_scale: float,
                 log: Callable[[str], None],
                 options: SchedulerOptions = DEFAULT_OPTIONS) -> None:
        self.plan = plan
        self.roofline = roofline
        self.time_scale = time_scale
        self.log = log
        self.decode_log_interval = options.decode_log_interval
        self.waiting: deque[SimRequest] = deque()
        self.running = RunningSet()
        self._fresh: list[SimRequest] = []  # admitted, first token not yet written
        self.stats = EngineStats()
        self._wake = asyncio.Event()
        self._slots_per_request = tracking_slots(plan.mamba_strategy, plan.overlap_schedule,
                                                 options.prefix_state)
        self._window_tokens = 0.0
        self._window_time = 0.0
        self._modeled_clock = 0.0
        self._decoded = 0.0  # tokens decoded so far (published at each decode log interval)
        # SGLang's batch_is_full: after an admission found no room, none is tried until a
        # request finishes or is retracted (a decaying new_token_ratio alone admits nothing)
        self._batch_full = False
        self._anchor: tuple[float, float] | None = None  # (wall, modeled clock) pacing origin
        self.latencies = RequestLatencies()
        # Steps advanced per loop iteration at most. Unbounded, high time scales batch many
        # steps per wall-clock wake-up, and requests that arrive meanwhile wait for the chunk;
        # SGLang admits them at its next step (an exact replay sets 1).
        self.max_chunk_steps = options.max_chunk_steps
        self.cache = options.cache or PrefixCache("none", 0, enabled=False)
        self.speed = options.speed  # < 1: a degraded GPU, every step that slower
        self._recent_prefill: deque[tuple[int, int]] = deque()  # (cached, prompt), last 32
        self._recent_sums = [0, 0]  # their cached and prompt tokens
        self._last_cached = 0
        self._idle_prefill_s = 0.0

    async def submit(self, prompt_tokens: int, target_tokens: int, max_new_tokens: int = 0,
                     data: bytes = b"") -> SimRequest:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        req = SimRequest(prompt_tokens, target_tokens, future, arrived_at=self._modeled_clock,
                         max_new_tokens=max_new_tokens, data=data)
        self.waiting.append(req)
        self.stats.queued = len(self.waiting)
        self._wake.set()
        await future
        return req

    def enqueue(self, prompt_tokens: int, target_tokens: int,
                on_done: Callable[[SimRequest, float], None]) -> None:
        """A replay's request, queued now (no event loop): `on_done` when it finishes."""
        self.waiting.append(SimRequest(prompt_tokens, target_tokens, None, on_done=on_done,
                                       arrived_at=self._modeled_clock))

    def _kv_used(self) -> int:
        """KV tokens the running requests hold."""
        return self.running.kv_used()

    def _admit(self) -> int:
        """Move waiting requests into the running batch; return tokens to prefill. SGLang
        prefills them in batches of chunked_prefill_size new tokens, each matched against the
        prefix cache before it is inserted: prompts prefilled together share nothing, a later
        batch reuses what an earlier one cached (under the overlap schedule, one before the
        last: real, a group of four 1,560-token prompts in two batches shared 2.7 %)."""
        plan = self.plan
        if self._batch_full:
            return 0
        room = (plan.max_total_num_tokens - self._kv_used()
                - self.stats.new_token_ratio * self.running.reserve_total())
        prefill = cached_sum = 0
        batch: list[SimRequest] = []
        chunk: list[SimRequest] = []  # one prefill batch: chunked_prefill_size tokens
        chunk_tokens = 0
        previous: list[SimRequest] = []
        mamba_limit = plan.mamba_slots if plan.mamba_cap is not None else math.inf
        while self.waiting:
            if len(self.running) >= plan.max_running_requests:
                self._batch_full = True
                break
            nxt = self.waiting[0]
            if nxt.abandoned():
                self.waiting.popleft()
                continue
            cached = (min(self.cache.match(nxt.data), nxt.prompt_tokens - 1)
                      if not nxt.retractions else 0)
            need = nxt.prompt_tokens + int(nxt.generated) - cached + nxt.reserve() + 1
            if need > room and (self.running or batch):
                self._batch_full = True
                break
            if (len(self.running) + 1) * self._slots_per_request > mamba_limit:
                self._batch_full = True
                break
            self.waiting.popleft()
            nxt.admitted_at = self._modeled_clock
            if not nxt.retractions:
                nxt.cached_tokens = cached
                cached_sum += cached
            self.running.append(nxt)
            if nxt.first_token_at is None:
                self._fresh.append(nxt)
            batch.append(nxt)
            chunk.append(nxt)
            room -= need
            prefill += nxt.prompt_tokens + int(nxt.generated) - cached
            chunk_tokens += nxt.prompt_tokens + int(nxt.generated) - cached
            if chunk_tokens >= plan.chunked_prefill_size:  # the rest go in later batches
                # with the overlap schedule the next batch is formed before this one's
                # results are in the tree: it sees the batch before this one
                self._cache_batch(previous if plan.overlap_schedule else chunk)
                previous = chunk if plan.overlap_schedule else []
                chunk, chunk_tokens = [], 0
        self._cache_batch(previous + chunk)
        if batch:
            self._count_prefill(cached_sum, sum(r.prompt_tokens for r in batch))
        return prefill

    def _cache_batch(self, chunk: list[SimRequest]) -> None:
        """Insert one prefill batch. The running prompts' prefixes are in the cache (locked);
        what else it keeps must fit in the pool's free part."""
        if not self.cache.enabled:
            return
        cache_room = self.plan.max_total_num_tokens - int(self.running.generated_total())
        for req in chunk:
            self.cache.insert(req.data, room=cache_room)

    def _count_prefill(self, cached: int, prompt: int) -> None:
        self.stats.cached_tokens_total += cached
        self._recent_prefill.append((cached, prompt))
        sums = self._recent_sums
        sums[0], sums[1] = sums[0] + cached, sums[1] + prompt
        if len(self._recent_prefill) > 32:
            old_cached, old_prompt = self._recent_prefill.popleft()
            sums[0], sums[1] = sums[0] - old_cached, sums[1] - old_prompt
        self.stats.cache_hit_rate = sums[0] / max(1, sums[1])
        self._last_cached = cached

    def _steps_that_fit(self, steps: int, accept: float) -> int:
        """Decode steps the KV pool lets the batch take before it is full (≥ 1 once
        `_retract_if_full` ran); the ratio decays per step taken, as SGLang's does."""
        free = self.plan.max_total_num_tokens - self._kv_used()
        steps = max(1, min(steps, int(free // (len(self.running) * accept))))
        self.stats.new_token_ratio = max(self.stats.new_token_ratio
                                         - RATIO_DECAY_PER_STEP * steps, MIN_NEW_TOKEN_RATIO)
        return steps

    def _retract_if_full(self, accept: float) -> None:
        """When the next decode step does not fit, retract the requests with the fewest
        output tokens until it does (SGLang's retract_decode): back to the queue, to be
        prefilled again; the ratio becomes what the remaining ones have written."""
        total = self.plan.max_total_num_tokens
        if total - self._kv_used() >= len(self.running) * accept:
            return
        keep = sorted(self.running, key=lambda r: (r.generated, -r.prompt_tokens), reverse=True)
        retracted: list[SimRequest] = []
        used = before = self._kv_used()
        while len(keep) > 1 and total - used < len(keep) * accept:
            req = keep.pop()
            used -= req.prompt_tokens + int(req.generated)
            retracted.append(req)
        for req in retracted:
            req.retractions += 1
            self.waiting.append(req)  # SGLang: the back of the queue (FCFS, no sort)
        self.running = RunningSet(keep)
        kept = {id(r) for r in keep}
        self._fresh = [r for r in self._fresh if id(r) in kept]
        self._batch_full = False
        self.stats.retracted_last = len(retracted)
        self.stats.retracted_total += len(retracted)
        written = sum(int(r.generated) for r in keep)
        allowed = sum(r.max_new_tokens or r.target_tokens for r in keep)
        old_ratio = self.stats.new_token_ratio
        self.stats.new_token_ratio = min(1.0, (written + RETRACT_DECODE_STEPS * len(keep))
                                         / (allowed + 1))
        mamba = len(retracted) * self._slots_per_request if self.plan.mamba_slots else None
        self.log(retract_line(len(retracted), int(before - used), mamba, old_ratio,
                              self.stats.new_token_ratio))

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
                # requests sent together reach SGLang's scheduler within one of its polls
                # and are prefilled in one batch (real: a group's members sent at once
                # shared 2.7 % of their prompt tokens)
                await asyncio.sleep(GATHER_S)
                self._anchor = None  # idle time is not owed to anyone
            turn = self._next_turn()
            if turn is None:
                await asyncio.sleep(max(self._idle_prefill_s / self.time_scale,
                                        MIN_WALL_CHUNK_S))
                self._anchor = None
                continue
            await self._sleep_modeled(turn.modeled)
            before = len(self.running)
            self._advance(turn)
            if len(self.running) < before:
                await self._let_clients_send()

    def run_until_idle(self) -> None:
        """The loop without a clock or event loop, for replays (clients send from `on_done`,
        before the next admission, as they reach SGLang within its poll)."""
        while self.running or self.waiting:
            turn = self._next_turn()
            if turn is not None:
                self._advance(turn)
            elif self.waiting:
                raise RuntimeError("replay: the first waiting request does not fit an idle "
                                   "server (its mamba slots exceed the pool)")

    def _next_turn(self) -> Turn | None:
        """Admit and prefill, retract if the next step does not fit, size the chunk of decode
        steps to the next event; None when nothing runs (prefill time: `_idle_prefill_s`)."""
        prefill = self._admit()
        if prefill:
            self.stats.prefill_tokens_total += prefill
            if self.log is not no_log:
                self._log_prefill(prefill)
        batches = math.ceil(prefill / self.plan.chunked_prefill_size)
        modeled = self.roofline.prefill_s(prefill, batches) / self.speed if prefill else 0.0
        if not self.running:
            self._idle_prefill_s = modeled
            return None
        accept = self.roofline.accept_len
        self._retract_if_full(accept)
        n = len(self.running)
        avg_ctx = self._kv_used() / n
        step = self.roofline.decode_step_s(n, avg_ctx) / self.speed
        to_finish = math.ceil(self.running.fewest_left() / accept)
        min_steps = math.ceil(MIN_WALL_CHUNK_S * self.time_scale / step)
        chunk = self._steps_that_fit(
            max(1, min(to_finish, min_steps, self.max_chunk_steps or min_steps)), accept)
        first_token = self._modeled_clock + modeled + step  # after the prefill, 1 step
        modeled += self.roofline.decode_steps_s(n, avg_ctx, chunk, accept) / self.speed
        return Turn(chunk, accept, modeled, first_token)

    async def _let_clients_send(self) -> None:
        """Answered clients send their next rows before the next admission, as they reach
        SGLang within its poll: yield until the queue stops growing (a few loop turns)."""
        quiet = 0
        for _ in range(16):
            waiting = len(self.waiting)
            await asyncio.sleep(0)
            quiet = quiet + 1 if len(self.waiting) == waiting else 0
            if quiet >= 2:
                return

    def _advance(self, turn: Turn) -> None:
        chunk, accept, modeled, first_token = turn
        self._modeled_clock += modeled
        for req in self._fresh:
            req.first_token_at = first_token
        self._fresh = []
        produced = self.running.advance(chunk * accept)
        before_steps = self.stats.decode_steps
        self.stats.decode_steps += chunk
        self._window_tokens += produced
        self._window_time += modeled
        self._publish()
        crossed = (self.stats.decode_steps // self.decode_log_interval
                   > before_steps // self.decode_log_interval)
        self._decoded += produced
        if crossed:  # SGLang updates realtime_tokens_total{mode="decode"} at each log line
            self.stats.decode_tokens_total = int(self._decoded)
            self.stats.gen_throughput = self._window_tokens / max(self._window_time, 1e-9)
            self._log_decode()
            self._window_tokens = self._window_time = 0.0
        done = self.running.take_finished()
        gone = self.running.abandoned()  # SGLang aborts these and frees their slots
        self.running.drop(gone)
        for req in done:
            self.stats.prompt_tokens_total += req.prompt_tokens
            self.stats.generation_tokens_total += req.target_tokens
            self.stats.requests_total += 1
            self._record(req)
        if done or gone:
            self._batch_full = False  # a request finished (or went away): try admitting again
        self._publish()
        for req in done:  # after the books are closed: a replay's client sends from here
            req.finish(self._modeled_clock)

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
        return usage_part(self.stats, self.kv_usage(), self.mamba_usage(), decode)

    def _log_prefill(self, tokens: int) -> None:
        self._publish()
        pending = sum(r.prompt_tokens for r in self.waiting)
        throughput = tokens / max(self.roofline.prefill_s(tokens), 1e-9)
        self.log(prefill_line(self.stats, self._usage_part(decode=False),
                              self._last_admitted(), tokens, self._last_cached, pending,
                              throughput))

    def _last_admitted(self) -> int:
        return self.running.just_admitted()

    def _log_decode(self) -> None:
        spec = ""
        if self.plan.draft_tokens:
            accept = self.roofline.accept_len
            rate = (accept - 1) / max(1, self.plan.draft_tokens - 1)
            spec = f"accept len: {accept:.2f}, accept rate: {rate:.2f}, "
        graph = self.roofline.graphed(len(self.running))
        self.log(decode_line(self.stats, self._usage_part(decode=True), len(self.running),
                             len(self.waiting), graph, spec))
