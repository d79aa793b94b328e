"""One epoch of the `generate` flow: one fleet configuration from launch to stop.

launch → wait healthy → measure capacity → generate shards under the regression watch →
stop (always). What it returns is all the decision after it needs: whether the fleet failed
to start, what the watch saw, and the hardware the policy reasons about.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flows.advice import advice_handler
from flows.job import Hardware, Progress, RunTotals, capacity_artifact, hardware_of
from flows.repair import asymmetry_handler, relaunch_handler
from flows.rollout import LiveConfig, canary_handler
from infra.settings import JobSettings
from infra.sglang.memory import MemoryPlan
from infra.storage import Destination
from tasks.capacity import Capacity, capacity_note, measure_capacity
from tasks.engines import engine_for
from tasks.fleet_control import FleetControl
from tasks.health import ServerStartFailed, wait_healthy
from tasks.monitor import FleetMonitor
from tasks.rolling import RollingFleet
from tasks.servers import ServerHandle, launch_servers, stop_servers
from tasks.shards import JobState, generate_shards
from tasks.tuning.diagnosis import generated_per_finished
from tasks.tuning.ledger import TuningLedger, config_key
from tasks.tuning.policy import gain_to_pay_for_restart, pools_pinned, propose, restart_cost
from tasks.tuning.watch import RegressionWatch, WatchResult
from tasks.upload import ShardUploader


@dataclass
class JobContext:
    """What every epoch of one flow run shares."""

    out: Path
    dest: Destination | None
    monitor: FleetMonitor
    totals: RunTotals
    logger: Any
    node_manifest: str | None  # a node of a multi-node job publishes its own manifest
    ledger: TuningLedger
    progress: Progress


@dataclass
class TunerState:
    """Carried from epoch to epoch by the outer loop."""

    mem_ceiling: float
    restarts: int = 0
    predicted_tok_s_per_gpu: float | None = None  # the model's figure for this epoch's config
    restarted_alone: set[str] = field(default_factory=set)  # slow servers restarted once
    relaunched: dict[str, int] = field(default_factory=dict)  # dead servers started again


@dataclass(frozen=True)
class EpochOutcome:
    start_failure: ServerStartFailed | None  # after epoch 1 (epoch 1 raises it)
    result: WatchResult | None
    hw: Hardware
    settings: JobSettings  # the config the fleet ran at the end (a rollout changes it)

    @property
    def failure(self) -> str | None:
        return str(self.start_failure) if self.start_failure is not None else None


def run_epoch(settings: JobSettings, state: JobState, ctx: JobContext, tuner: TunerState,
              epoch: int) -> EpochOutcome:
    """Run one configuration until the work is done or the watch asks for a restart."""
    uploader = ShardUploader(ctx.dest, ctx.out, ctx.node_manifest) if ctx.dest else None
    ctx.progress.uploader = uploader
    hw = hardware_of(settings, None)
    live = LiveConfig(settings)
    fleet: RollingFleet | None = None
    try:
        handles = launch_servers(settings, str(ctx.out), epoch)
        fleet = RollingFleet(handles, settings, ctx.out, epoch, FleetControl(), ctx.logger,
                             threading.Event(),
                             engine_for(settings).checks_gpu_memory_after_stop)
        try:
            took = wait_healthy(handles, settings.api_key, settings.startup_timeout_s)
        except ServerStartFailed as exc:
            if epoch == 1:
                raise  # nothing known to work: the user's config must be fixed
            return EpochOutcome(exc, None, hw, settings)
        ctx.logger.info("epoch %d: %d servers healthy after %.1f s", epoch, len(handles), took)
        ctx.totals.startup_s += took
        if ctx.totals.cycles:
            ctx.totals.cycles[-1].next_fleet_up(took)
        result, hw = _serve(live, state, ctx, tuner, epoch, fleet, took)
        return EpochOutcome(None, result, hw, live.settings)
    finally:
        _stop(settings, ctx, fleet.handles() if fleet else [], uploader)


def _serve(live: LiveConfig, state: JobState, ctx: JobContext, tuner: TunerState,
           epoch: int, fleet: RollingFleet, startup_s: float,
           ) -> tuple[WatchResult, Hardware]:
    settings = live.settings
    caps = measure_capacity(fleet.handles(), settings.api_key)
    fleet.caps = {c.index: c for c in caps}
    ctx.totals.capacities = caps
    ctx.totals.caps_by_epoch[epoch] = {f"server-{c.index}": c.max_running_requests
                                       for c in caps}
    capacity_artifact(settings, caps)
    hw = hardware_of(settings, caps[0].version)
    plan = hw.plan(settings)
    note = capacity_note(plan, caps)
    if note:
        ctx.logger.info(note)
    ctx.monitor.watch({f"server-{c.index}": c.url for c in caps}, epoch)
    watch = _watch(live, hw, plan, caps, ctx, tuner, state, startup_s)
    if engine_for(settings).owns_servers:
        watch.on_proposal = canary_handler(live, fleet, ctx, tuner, hw, epoch, fleet.abort,
                                           lambda: watch)
        watch.on_asymmetric = asymmetry_handler(live, fleet, ctx, tuner, hw, epoch,
                                                lambda: watch)
        watch.on_dead = relaunch_handler(live, fleet, ctx, tuner, hw, epoch, lambda: watch)
    else:  # someone else's servers: advice instead of restarts, never a fleet restart
        watch.on_proposal = advice_handler(live, ctx, lambda: watch)
        watch.advise_only = True
    watch.start()
    began = time.monotonic()
    try:
        stats = generate_shards(settings, state, caps, ctx.progress, watch.stop, fleet.control)
    finally:
        ctx.totals.generating_s += time.monotonic() - began
        fleet.abort.set()  # a canary cycle in progress gives up; no server starts after this
        result = watch.close()
    if not result.triggered and result.last_check:
        ctx.logger.info("epoch %d kept its config; last check: %s", epoch, result.last_check)
    ctx.totals.answers += stats.completed + stats.errors
    ctx.totals.primers += stats.primers
    return result, hw


def _stop(settings: JobSettings, ctx: JobContext, handles: list[ServerHandle],
          uploader: ShardUploader | None) -> None:
    if handles and engine_for(settings).owns_servers:
        report = stop_servers(handles, str(ctx.out), settings.stop_grace_s, settings.api_key,
                              engine_for(settings).checks_gpu_memory_after_stop)
        ctx.logger.info("stopped %d servers (SIGKILLed: %s, ports still busy: %s)",
                        report.stopped, report.killed or "none", report.ports_busy or "none")
        if report.gpus_busy:
            ctx.logger.warning("GPU memory still in use after stop (MiB by GPU): %s; the next "
                               "launch may get smaller pools", report.gpus_busy)
    if uploader is not None and uploader.close():
        ctx.logger.warning("%d shard uploads failed; the final upload retries them",
                           uploader.failures)


def _watch(live: LiveConfig, hw: Hardware, plan: MemoryPlan | None, caps: list[Capacity],
           ctx: JobContext, tuner: TunerState, state: JobState,
           startup_s: float) -> RegressionWatch:
    settings = live.settings
    tuning = settings.tuning
    # The memory model plans whole GPUs: with several servers per GPU only moves that keep
    # each server's pools as pinned (max_total_tokens, max_mamba_cache_size) are planned.
    shared = settings.servers_per_gpu > 1
    enabled = (tuning.enabled and tuner.restarts < tuning.max_restarts
               and len(state.pending) > 2 * len(caps) and hw.model is not None
               and (not shared or pools_pinned(settings.server, hw.model.hybrid)))

    def can_propose(diag: Any, min_gain: float) -> Any:
        if hw.model is None or hw.gpu is None or hw.version is None:
            return None
        now = live.settings
        concurrency = now.client.concurrency_per_server
        tried = ctx.ledger.tried() | {config_key(now.server, concurrency)}
        demand = ctx.totals.demand(tuning.avg_context,
                                   generated_per_finished(ctx.monitor.snapshot()),
                                   now.sampling.max_new_tokens)
        if demand.workload is None and diag.kind != "client-bound":
            return None  # no move scored on the decode rate alone: wait for the first commit
        return propose(diag, now.server, concurrency, hw.model, hw.gpu, hw.version, tried,
                       tuner.mem_ceiling, demand, min_gain, tuning.allow_lossy,
                       pinned=shared, reuse=ctx.totals.prefix_reuse())

    # Work left when this epoch started, in prompts; what is done since comes off it.
    totals = ctx.totals
    left_at_start, done_at_start = len(state.pending) * settings.shard_size, totals.done

    def pace(diag: Any) -> tuple[float, float, int]:
        """(output tokens per prompt, one server's wall tok/s, prompts left) at `diag`."""
        per_prompt = (totals.tokens / totals.done if totals.done
                      else 0.75 * settings.sampling.max_new_tokens)
        left = max(0, left_at_start - (totals.done - done_at_start))
        return per_prompt, diag.tok_s_per_gpu * hw.time_scale, left

    def gain_needed(diag: Any) -> float:
        per_prompt, server_tok_s, left = pace(diag)
        if server_tok_s <= 0:
            return tuning.min_predicted_gain
        cost = restart_cost(startup_s, tuning.drain_timeout_s, settings.stop_grace_s,
                            per_prompt, max(c.max_running_requests for c in caps),
                            server_tok_s)
        return gain_to_pay_for_restart(left, per_prompt, server_tok_s, len(caps), cost,
                                       tuning.min_predicted_gain, tuning.restart_payback)

    def work_left_s(diag: Any) -> float:
        """Wall seconds the fleet needs for the work left at the diagnosed rate."""
        per_prompt, server_tok_s, left = pace(diag)
        return left * per_prompt / (server_tok_s * len(caps)) if server_tok_s > 0 else 0.0

    best = ctx.ledger.best(config_key(settings.server, settings.client.concurrency_per_server))
    watch = RegressionWatch(
        ctx.monitor, {f"server-{c.index}": c.max_running_requests for c in caps}, plan,
        hw.time_scale, tuning.window_s, tuning.target_tok_s_per_gpu,
        best.tok_s_per_gpu if best else None, can_propose, enabled, gain_needed)
    watch.work_left_s = work_left_s
    return watch
