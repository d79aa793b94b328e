"""One epoch of the `generate` flow: one fleet configuration from launch to stop.

launch → wait healthy → measure capacity → generate shards under the tuner's watch → stop
(always). What it returns is what the decision after it needs: whether the fleet failed to
start, and what the watch saw. The tuner (tasks/tuning/tuner.py) owns the configuration.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.progress import Progress, capacity_artifact
from infra.storage import Destination
from tasks.capacity import capacity_note
from tasks.health import ServerStartFailed
from tasks.local_servers import ServerHandle
from tasks.monitor import FleetMonitor
from tasks.rolling import RollingFleet
from tasks.servers import launch_servers, measure_capacity, stop_servers, wait_healthy
from tasks.shards import JobState, generate_shards
from tasks.totals import RunTotals
from tasks.tuning.tuner import Tuner, WorkLeft
from tasks.tuning.watch import WatchResult
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
    progress: Progress


@dataclass(frozen=True)
class EpochOutcome:
    start_failure: ServerStartFailed | None  # after epoch 1 (epoch 1 raises it)
    result: WatchResult | None


def run_epoch(state: JobState, ctx: JobContext, tuner: Tuner, epoch: int) -> EpochOutcome:
    """Run the tuner's configuration until the work is done or the watch asks for a
    restart."""
    settings = tuner.settings
    uploader = ShardUploader(ctx.dest, ctx.out, ctx.node_manifest) if ctx.dest else None
    ctx.progress.uploader = uploader
    fleet: RollingFleet | None = None
    try:
        engine = tuner.engine
        handles = launch_servers(engine, settings.server, str(ctx.out), epoch)
        fleet = RollingFleet(handles, engine, settings, ctx.out, epoch, ctx.logger)
        try:
            took = wait_healthy(handles, engine)
        except ServerStartFailed as exc:
            if epoch == tuner.first_epoch and tuner.resumed is None:
                raise  # nothing known to work: the user's config must be fixed
            return EpochOutcome(exc, None)
        ctx.logger.info("epoch %d: %d servers healthy after %.1f s", epoch, len(handles), took)
        ctx.totals.startup_s += took
        tuner.fleet_up(took)
        return EpochOutcome(None, _serve(state, ctx, tuner, epoch, fleet, took))
    finally:
        _stop(ctx, tuner, fleet.handles() if fleet else [], uploader)


def _serve(state: JobState, ctx: JobContext, tuner: Tuner, epoch: int, fleet: RollingFleet,
           startup_s: float) -> WatchResult:
    settings = tuner.settings
    capacities = measure_capacity(fleet.handles(), fleet.engine)
    fleet.capacity_of = {c.index: c for c in capacities}
    capacity_artifact(settings.server, capacities)
    note = capacity_note(tuner.fleet_measured(epoch, capacities), capacities)
    if note:
        ctx.logger.info(note)
    ctx.monitor.watch({f"server-{c.index}": c.url for c in capacities}, epoch)
    watch = tuner.watch(epoch, fleet, WorkLeft(len(state.pending),
                                               len(state.pending) * settings.shard_size),
                        startup_s)
    watch.start()
    began = time.monotonic()
    try:
        stats = generate_shards(settings, state, capacities, fleet.engine.requests,
                                ctx.progress, watch.stop, fleet.control)
    finally:
        ctx.totals.generating_s += time.monotonic() - began
        fleet.abort.set()  # a canary cycle in progress gives up; no server starts after this
        result = watch.close()
    if not result.triggered and result.last_check:
        ctx.logger.info("epoch %d kept its config; last check: %s", epoch, result.last_check)
    ctx.totals.answers += stats.completed + stats.errors
    ctx.totals.primers += stats.primers
    return result


def _stop(ctx: JobContext, tuner: Tuner, handles: list[ServerHandle],
          uploader: ShardUploader | None) -> None:
    report = stop_servers(handles, str(ctx.out), tuner.engine) if handles else None
    if report is not None:
        ctx.logger.info("stopped %d servers (SIGKILLed: %s, ports still busy: %s)",
                        report.stopped, report.killed or "none", report.ports_busy or "none")
        if report.gpus_busy:
            ctx.logger.warning("GPU memory still in use after stop (MiB by GPU): %s; the next "
                               "launch may get smaller pools", report.gpus_busy)
    if uploader is not None and uploader.close():
        ctx.logger.warning("%d shard(s) not uploaded yet: the final upload sends them",
                           uploader.failures)
