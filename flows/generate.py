"""The `generate` flow: the seeds' manual loop as one restartable Prefect flow.

plan shards → [launch servers → wait healthy → measure capacity → generate shards (watched)
→ stop] → upload. When the watch finds a better configuration (or a regression, or a slower
config to roll back), the bracket repeats with new flags: drain, stop, relaunch, resume. The
output folder's manifest is the only ledger, so a rerun of the flow resumes where it stopped.
The fleet is stopped on every exit path: `finally` for errors, hooks for cancellation and
crashes, PDEATHSIG if this process dies.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect import flow, get_run_logger
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from flows.report import write_report
from flows.summary import format_summary
from infra.ledger import ManifestEntry
from infra.processes import ephemeral_port_warning
from infra.prompts import validate_input
from infra.settings import NULL, JobSettings, load_settings
from infra.sglang.memory import MemoryPlan, PoolsDoNotFit, plan_memory
from infra.sglang.planner import MAX_MEM_FRACTION
from infra.sglang.profiles import GpuProfile, ModelProfile, gpu_profile, model_profile
from infra.sglang.versions import SGLangVersion, parse_version
from infra.storage import Destination, open_destination
from tasks.capacity import Capacity, capacity_note, measure_capacity
from tasks.health import ServerStartFailed, wait_healthy
from tasks.monitor import FleetMonitor
from tasks.servers import (
    ServerHandle,
    build_launch_specs,
    launch_servers,
    registry_for,
    stop_fleet,
    stop_servers,
)
from tasks.shards import JobState, generate_shards, plan_shards
from tasks.tuning.decide import restart_on_regression
from tasks.tuning.ledger import TuningLedger, config_key
from tasks.tuning.policy import propose, required_gain
from tasks.tuning.watch import RegressionWatch, WatchResult
from tasks.upload import ShardUploader, restore_from, upload


def job_settings(prompts: str | None = None, output: str | None = None,
                 engine: str | None = None, gpus: list[int] | None = None,
                 model: str | None = None, config_file: str | None = None,
                 overrides: dict[str, Any] | None = None) -> JobSettings:
    """Flow parameters → settings (explicit parameters win over overrides, file and env)."""
    explicit = {"prompts": prompts, "output": output, "engine": engine, "gpus": gpus,
                "model": model}
    # In `overrides` a None was given on purpose ({"server.max_running_requests": null}):
    # it overrides the config file. An explicit parameter left None means "not given".
    given = {k: (NULL if v is None else v) for k, v in (overrides or {}).items()}
    merged = {**given, **{k: v for k, v in explicit.items() if v is not None}}
    return load_settings(config_file, **merged)


def job_paths(settings: JobSettings, node: str | None) -> tuple[Path, str | None]:
    """(local ledger folder, upload target). A node of a multi-node job keeps its own ledger
    under `nodes/<node>` and always publishes to the shared output."""
    if node is None:
        return settings.local_output(), settings.upload_target()
    return (settings.local_output() / "nodes" / node,
            settings.upload_target() or str(settings.local_output()))


def preflight(settings: JobSettings, check_input: bool = True) -> list[str]:
    """Everything that can be checked before a server starts or an output folder appears:
    the input file, the launch commands (version-aware flags), the sim's profiles. Raises
    ValueError subclasses whose message names the field and the fix; returns warnings (legal
    settings that are likely to hurt)."""
    if check_input:  # the flow skips it: plan_shards validates before any server starts
        validate_input(settings.prompts)
    specs = build_launch_specs(settings, settings.local_output())
    if settings.engine == "sim":
        model_profile(settings.model, settings.weights_gib)
        gpu_profile(settings.sim.gpu)
    warnings = [w for w in [ephemeral_port_warning([s.port for s in specs])] if w]
    if settings.servers_per_gpu > 1 and settings.tuning.enabled:
        warnings.append(f"servers_per_gpu={settings.servers_per_gpu}: restart-on-regression "
                        "is off, because the memory model plans whole GPUs")
    return warnings


def _stop_fleet_hook(flow_: Any, flow_run: Any, state: Any) -> None:
    """Cancellation/crash hook (runs in the worker or runner): stop servers of this job."""
    params = dict(getattr(flow_run, "parameters", {}) or {})
    node = params.pop("node", None)
    params.pop("shards", None)
    try:
        settings = job_settings(**params)
    except Exception:  # a hook must never raise; without settings there is nothing to stop
        return
    secrets = (settings.api_key.get_secret_value(),) if settings.api_key else ()
    stop_fleet([], registry_for(job_paths(settings, node)[0]), settings.stop_grace_s, secrets)


@dataclass
class RunTotals:
    """Counted from commits (what the ledger holds), not from answers: a shard cut short by
    a restart is redone, and its first answers are not counted twice."""

    tokens: int = 0
    done: int = 0
    errors: int = 0
    answers: int = 0  # every answer received, including those of shards redone after a drain
    capacities: list[Capacity] = field(default_factory=list)
    caps_by_epoch: dict[int, dict[str, int]] = field(default_factory=dict)  # for the report
    cycles: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Hardware:
    """What the policy needs to reason about a configuration; None parts disable tuning."""

    model: ModelProfile | None
    gpu: GpuProfile | None
    version: SGLangVersion | None
    time_scale: float

    def plan(self, settings: JobSettings) -> MemoryPlan | None:
        """The memory model's view of the current flags (None without profiles)."""
        if self.model is None or self.gpu is None or self.version is None:
            return None
        try:
            return plan_memory(self.model, self.gpu, settings.server, self.version)
        except PoolsDoNotFit:
            return None


def hardware_of(settings: JobSettings, server_version: str | None) -> Hardware:
    gpu_name = settings.sim.gpu if settings.engine == "sim" else settings.gpu_type
    version_text = settings.sglang_version or server_version
    try:
        model = model_profile(settings.model, settings.weights_gib)
        gpu = gpu_profile(gpu_name)
        version = parse_version(version_text) if version_text else None
    except ValueError:
        model = gpu = version = None  # type: ignore[assignment]
    scale = settings.sim.time_scale if settings.engine == "sim" else 1.0
    return Hardware(model, gpu, version, scale)


def summarize(settings: JobSettings, state: JobState, totals: RunTotals,
              seconds: float) -> dict[str, Any]:
    caps = totals.capacities
    wall_tok_s = totals.tokens / seconds if seconds > 0 else 0.0
    hw = hardware_of(settings, caps[0].version if caps else None)
    plan = hw.plan(settings) if caps else None
    return {
        "output": settings.upload_target() or str(settings.local_output()),
        "prompts_total": state.plan.input_rows,
        "prompts_done_this_run": totals.done,
        "errors_this_run": totals.errors,
        "already_committed": state.committed_rows,
        "output_tokens": totals.tokens,
        "seconds": round(seconds, 2),
        "tok_s": round(wall_tok_s, 1),
        "tok_s_modeled_gpu_time": round(wall_tok_s / hw.time_scale, 1),
        "time_scale": hw.time_scale,
        "servers": [{"url": c.url, "max_running_requests": c.max_running_requests,
                     "max_total_num_tokens": c.max_total_num_tokens,
                     "max_mamba_cache_size": c.max_mamba_cache_size} for c in caps],
        "capacity_note": capacity_note(plan, caps),
        "restarts": len(totals.cycles),
        "answers_redone_after_drains": max(0, totals.answers - totals.done - totals.errors),
        "cycles": [{k: v for k, v in c.items() if k != "triggered_at"} for c in totals.cycles],
        "final_server_flags": settings.server.model_dump(exclude_none=True,
                                                         exclude={"extra_args"}),
    }


@flow(name="generate", on_cancellation=[_stop_fleet_hook],  # type: ignore[list-item]
      on_crashed=[_stop_fleet_hook],  # type: ignore[list-item]
      log_prints=False)
def generate(prompts: str | None = None, output: str | None = None, engine: str | None = None,
             gpus: list[int] | None = None, model: str | None = None,
             config_file: str | None = None,
             overrides: dict[str, Any] | None = None, shards: list[int] | None = None,
             node: str | None = None) -> dict[str, Any]:
    """Generate a completion for every prompt on a fleet of SGLang (or simulated) servers.

    `shards` and `node` are set by `generate-fleet` when this run is one node of a
    multi-node job: only those shards, published under the node's manifest."""
    logger = get_run_logger()
    settings = job_settings(prompts, output, engine, gpus, model, config_file, overrides)
    for warning in preflight(settings, check_input=False):
        logger.warning(warning)
    out, target = job_paths(settings, node)
    manifest_key = f"manifests/{node}.jsonl" if node else "manifest.jsonl"
    dest: Destination | None = None
    if target:
        dest = open_destination(target, settings.storage.endpoint_url, settings.storage.region,
                                settings.storage.multipart_mb)
        restored = restore_from(dest, out) if node is None else 0
        if restored:
            logger.info("restored %d committed shards from %s", restored, dest.label)
    state = plan_shards(
        str(settings.prompts), str(out), settings.shard_size)
    if shards is not None:
        owned = set(shards)
        state = replace(state, pending=[s for s in state.pending if s in owned])
    logger.info("plan %s: %d prompts in %d shards, %d pending", state.plan.fingerprint,
                state.plan.input_rows, state.plan.num_shards, len(state.pending))
    initial = state
    totals = RunTotals()
    started = time.monotonic()
    monitor = FleetMonitor(settings.tuning.sample_interval_s,
                           settings.api_key.get_secret_value() if settings.api_key else None)
    if state.pending:
        monitor.start()
        try:
            settings = _run_epochs(settings, state, out, dest, monitor, totals, logger,
                                   manifest_key if node else None, shards)
        finally:
            monitor.stop()
            monitor.write(out / "monitor" / f"metrics-{int(time.time())}.parquet")
    if target:
        rep = upload(
            str(out), target, settings.storage.endpoint_url, settings.storage.region,
            manifest_key, settings.storage.multipart_mb)
        logger.info("upload to %s: %d new, %d already there", rep.destination, rep.uploaded,
                    rep.skipped)
    summary = summarize(settings, initial, totals, time.monotonic() - started)
    if totals.capacities:
        _, artifact = write_report(out, summary, monitor.snapshot(), totals.cycles,
                                   hardware_of(settings, None).time_scale, totals.caps_by_epoch)
        create_markdown_artifact(artifact, key="run-report",
                                 description="throughput, pool usage and restarts")
    logger.info(format_summary(summary))
    return summary


def _run_epochs(settings: JobSettings, state: JobState, out: Path, dest: Destination | None,
                monitor: FleetMonitor, totals: RunTotals, logger: Any,
                node_manifest: str | None, shards: list[int] | None) -> JobSettings:
    """Run fleet configurations until no shard is pending; returns the final settings."""
    ledger = TuningLedger(out / "tuning.jsonl")
    mem_ceiling = MAX_MEM_FRACTION
    restarts = 0
    epoch = 0
    progress = _Progress(state, logger, None, totals)
    while state.pending:
        epoch += 1
        uploader = ShardUploader(dest, out, node_manifest) if dest is not None else None
        progress.uploader = uploader
        failure: str | None = None
        result: WatchResult | None = None
        handles: list[ServerHandle] = []
        hw = hardware_of(settings, None)
        try:
            handles = launch_servers(settings, str(out),
                                                                         epoch)
            try:
                took = wait_healthy(
                    handles, settings.api_key, settings.startup_timeout_s)
            except ServerStartFailed as exc:
                if epoch == 1:
                    raise  # nothing known to work: the user's config must be fixed
                failure = str(exc)
            if failure is None:
                logger.info("epoch %d: %d servers healthy after %.1f s", epoch, len(handles),
                            took)
                if totals.cycles and totals.cycles[-1].get("triggered_at"):
                    cycle = totals.cycles[-1]
                    cycle["cycle_seconds"] = round(time.monotonic() - cycle.pop("triggered_at"), 2)
                    cycle["startup_seconds"] = round(took, 2)
                caps = measure_capacity(
                    handles, settings.api_key)
                totals.capacities = caps
                totals.caps_by_epoch[epoch] = {f"server-{c.index}": c.max_running_requests
                                               for c in caps}
                _capacity_artifact(settings, caps)
                hw = hardware_of(settings, caps[0].version)
                plan = hw.plan(settings)
                note = capacity_note(plan, caps)
                if note:
                    logger.info(note)
                monitor.watch({f"server-{c.index}": c.url for c in caps}, epoch)
                watch = _watch(settings, hw, plan, caps, monitor, ledger, mem_ceiling,
                               restarts, state, totals, took)
                watch.start()
                try:
                    stats = generate_shards(
                        settings, state, caps, progress, watch.stop)
                finally:
                    result = watch.close()
                if not result.triggered and result.last_check:
                    logger.info("epoch %d kept its config; last check: %s", epoch,
                                result.last_check)
                totals.answers += stats.completed + stats.errors
        finally:
            if handles:
                report = stop_servers(
                    handles, str(out), settings.stop_grace_s, settings.api_key,
                    settings.engine == "sglang")
                logger.info("stopped %d servers (SIGKILLed: %s, ports still busy: %s)",
                            report.stopped, report.killed or "none",
                            report.ports_busy or "none")
                if report.gpus_busy:
                    logger.warning("GPU memory still in use after stop (MiB by GPU): %s; "
                                   "the next launch may get smaller pools",
                                   report.gpus_busy)
            if uploader is not None and uploader.close():
                logger.warning("%d shard uploads failed; the final upload retries them",
                               uploader.failures)
        decision, mem_ceiling = restart_on_regression(
            result, failure, epoch, settings.server, settings.client.concurrency_per_server,
            str(ledger.path), hw.model, hw.gpu, hw.version, mem_ceiling,
            result.required_gain if result and result.required_gain is not None
            else settings.tuning.min_predicted_gain, settings.tuning.avg_context,
            settings.tuning.allow_lossy)
        if failure is not None and decision is None:
            raise ServerStartFailed(f"servers failed to start and no earlier config worked: "
                                    f"{failure}", handles[0], "")
        state = plan_shards(
            str(settings.prompts), str(out), settings.shard_size)
        if shards is not None:
            state = replace(state, pending=[s for s in state.pending if s in set(shards)])
        if decision is not None and state.pending:
            restarts += 1
            measured = result.measured_tok_s_per_gpu if result else None
            totals.cycles.append({
                "epoch": epoch, "measured_tok_s_per_gpu": measured,
                "diagnosis": result.diagnosis.kind if result and result.diagnosis else
                "start failed", "reason": decision.reason,
                "old": config_key(settings.server, settings.client.concurrency_per_server),
                "new_flags": decision.flags.model_dump(exclude_none=True,
                                                       exclude={"extra_args"}),
                "new_concurrency": decision.concurrency,
                "triggered_at": result.triggered_at if result else None})
            logger.warning("restart %d: %s", restarts, decision.reason)
            settings = settings.model_copy(update={
                "server": decision.flags,
                "client": settings.client.model_copy(
                    update={"concurrency_per_server": decision.concurrency})})
            create_table_artifact(key="tuning-ledger", description="configs tried",
                                  table=[{k: v for k, v in c.items() if k != "triggered_at"}
                                         for c in totals.cycles])
    return settings


def _watch(settings: JobSettings, hw: Hardware, plan: MemoryPlan | None, caps: list[Capacity],
           monitor: FleetMonitor, ledger: TuningLedger, mem_ceiling: float, restarts: int,
           state: JobState, totals: RunTotals, startup_s: float) -> RegressionWatch:
    tuning = settings.tuning
    tried = ledger.tried() | {config_key(settings.server, settings.client.concurrency_per_server)}
    enough_work = len(state.pending) > 2 * len(caps)
    # The memory model plans whole GPUs: with several servers per GPU its predictions
    # would be for memory no server has.
    enabled = (tuning.enabled and restarts < tuning.max_restarts and enough_work
               and hw.model is not None and settings.servers_per_gpu == 1)

    def can_propose(diag: Any, min_gain: float) -> Any:
        if hw.model is None or hw.gpu is None or hw.version is None:
            return None
        return propose(diag, settings.server, settings.client.concurrency_per_server,
                       hw.model, hw.gpu, hw.version, tried, mem_ceiling, tuning.avg_context,
                       min_gain, tuning.allow_lossy)

    # Work left when this epoch started, in prompts; what is done since comes off it.
    left_at_start = len(state.pending) * settings.shard_size
    done_at_start = totals.done

    def gain_needed(diag: Any) -> float:
        left = max(0, left_at_start - (totals.done - done_at_start))
        per_prompt = (totals.tokens / totals.done if totals.done
                      else 0.75 * settings.sampling.max_new_tokens)
        gpu_tok_s = diag.tok_s_per_gpu * hw.time_scale  # wall-clock tok/s of one server
        if gpu_tok_s <= 0:
            return tuning.min_predicted_gain
        remaining_s = left * per_prompt / (gpu_tok_s * len(caps))
        # A running request is on average half done when the fleet stops: redone after.
        redo_s = per_prompt / 2 * max(c.max_running_requests for c in caps) / gpu_tok_s
        # Stopping: SGLang exits within seconds of SIGTERM; the grace is only a ceiling.
        cost_s = startup_s + tuning.drain_timeout_s + min(settings.stop_grace_s, 5.0) + redo_s
        return required_gain(remaining_s, cost_s, tuning.min_predicted_gain,
                             tuning.restart_payback)

    best = ledger.best()
    return RegressionWatch(
        monitor, {f"server-{c.index}": c.max_running_requests for c in caps}, plan,
        hw.time_scale, tuning.window_s, tuning.target_tok_s_per_gpu,
        best.tok_s_per_gpu if best else None, can_propose, enabled, gain_needed)


def _capacity_artifact(settings: JobSettings, caps: list[Capacity]) -> None:
    create_table_artifact(
        key="fleet-capacity", description="servers: config and measured capacity",
        table=[capacity_row(settings, c) for c in caps])


def capacity_row(settings: JobSettings, cap: Capacity) -> dict[str, Any]:
    """One server's row: the flags as requested (prefixed), then what the server measured —
    a requested max_running_requests (256) must never stand in the measured column (85)."""
    requested = settings.server.model_dump(exclude={"extra_args"}, exclude_none=True)
    return {"server": cap.url, "config": cap.config, "sglang": cap.version,
            **{f"requested_{k}": v for k, v in requested.items()},
            "max_running_requests": cap.max_running_requests,
            "max_total_num_tokens": cap.max_total_num_tokens,
            "max_mamba_cache_size": cap.max_mamba_cache_size}


class _Progress:
    """Commit callback: progress artifact (coarse updates), log line, background upload."""

    def __init__(self, state: JobState, logger: Any, uploader: ShardUploader | None,
                 totals: RunTotals) -> None:
        self.totals = totals
        self.total = state.plan.num_shards
        self.start_done = self.done = self.total - len(state.pending)
        self.tokens = 0
        self.t0 = time.monotonic()
        self.last_update = 0.0
        self.logger = logger
        self.uploader = uploader
        artifact = create_progress_artifact(
            progress=100.0 * self.done / self.total, key="generate-progress",
            description=f"{self.done}/{self.total} shards committed")
        assert isinstance(artifact, UUID)  # sync context: not a coroutine
        self.artifact_id = artifact

    def __call__(self, entry: ManifestEntry) -> None:
        if self.uploader is not None:
            self.uploader.submit(entry)
        self.done += 1
        self.tokens += entry.output_tokens
        self.totals.tokens += entry.output_tokens
        self.totals.done += entry.rows
        self.totals.errors += entry.errors
        elapsed = time.monotonic() - self.t0
        tok_s = self.tokens / elapsed if elapsed > 0 else 0.0
        this_run = self.done - self.start_done
        eta = elapsed / this_run * (self.total - self.done) if this_run else 0.0
        now = time.monotonic()
        if now - self.last_update > 2.0 or self.done == self.total:  # keep API calls coarse
            self.last_update = now
            update_progress_artifact(
                self.artifact_id, progress=100.0 * self.done / self.total,
                description=f"{self.done}/{self.total} shards, {tok_s:,.0f} tok/s (wall), "
                f"ETA {eta / 60:.1f} min")
        self.logger.info("shard %d committed (%d rows, %d errors) — %d/%d shards, %.0f tok/s",
                         entry.shard, entry.rows, entry.errors, self.done, self.total, tok_s)


if __name__ == "__main__":
    print(generate())
