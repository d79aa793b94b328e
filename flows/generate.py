"""The `generate` flow: the seeds' manual loop as one restartable Prefect flow.

plan shards → launch servers → wait healthy → measure capacity → generate shards → stop →
upload. The output folder's manifest is the ledger, so rerunning the flow (or retrying a
crashed run) resumes where it stopped. The fleet is stopped on every exit path: `finally`
for errors, hooks for cancellation and crashes, PDEATHSIG if this process dies.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect import flow, get_run_logger
from prefect.artifacts import (
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE

from flows.settings import JobSettings, load_settings
from infra.ledger import ManifestEntry
from infra.storage import open_destination
from tasks.capacity import Capacity, capacity_note, measure_capacity, predicted_plan
from tasks.health import wait_healthy
from tasks.servers import ServerHandle, launch_servers, registry_for, stop_fleet, stop_servers
from tasks.shards import JobState, generate_shards, plan_shards
from tasks.upload import ShardUploader, restore_from, upload


def job_settings(prompts: str | None = None, output: str | None = None,
                 engine: str | None = None, gpus: list[int] | None = None,
                 model: str | None = None, config_file: str | None = None,
                 overrides: dict[str, Any] | None = None) -> JobSettings:
    """Flow parameters → settings (explicit parameters win over file and environment)."""
    return load_settings(config_file, prompts=prompts, output=output, engine=engine, gpus=gpus,
                         model=model, **(overrides or {}))


def _stop_fleet_hook(flow_: Any, flow_run: Any, state: Any) -> None:
    """Cancellation/crash hook (runs in the worker or runner): stop servers of this job."""
    params = dict(getattr(flow_run, "parameters", {}) or {})
    try:
        settings = job_settings(**params)
    except Exception:
        return
    stop_fleet([], registry_for(settings.local_output()), settings.stop_grace_s)


def summarize(settings: JobSettings, state: JobState, capacities: list[Capacity],
              output_tokens: int, completed: int, errors: int, seconds: float) -> dict[str, Any]:
    wall_tok_s = output_tokens / seconds if seconds > 0 else 0.0
    scale = settings.sim.time_scale if settings.engine == "sim" else 1.0
    gpu = settings.sim.gpu if settings.engine == "sim" else settings.gpu_type
    version = settings.sglang_version or (capacities[0].version if capacities else None)
    plan = predicted_plan(settings.model, gpu, settings.server, version) if version else None
    return {
        "output": settings.upload_target() or str(settings.local_output()),
        "prompts_total": state.plan.input_rows,
        "prompts_done_this_run": completed,
        "errors_this_run": errors,
        "already_committed": state.committed_rows,
        "output_tokens": output_tokens,
        "seconds": round(seconds, 2),
        "tok_s": round(wall_tok_s, 1),
        "tok_s_modeled_gpu_time": round(wall_tok_s / scale, 1),
        "servers": [{"url": c.url, "max_running_requests": c.max_running_requests,
                     "max_total_num_tokens": c.max_total_num_tokens,
                     "max_mamba_cache_size": c.max_mamba_cache_size} for c in capacities],
        "capacity_note": capacity_note(plan, capacities),
    }


@flow(name="generate", on_cancellation=[_stop_fleet_hook],  # type: ignore[list-item]
      on_crashed=[_stop_fleet_hook],  # type: ignore[list-item]
      log_prints=False)
def generate(prompts: str | None = None, output: str | None = None, engine: str | None = None,
             gpus: list[int] | None = None, model: str | None = None,
             config_file: str | None = None,
             overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Generate a completion for every prompt on a fleet of SGLang (or simulated) servers."""
    logger = get_run_logger()
    settings = job_settings(prompts, output, engine, gpus, model, config_file, overrides)
    out = str(settings.local_output())
    target = settings.upload_target()
    dest = None
    if target:
        dest = open_destination(target, settings.storage.endpoint_url, settings.storage.region,
                                settings.storage.multipart_mb)
        restored = restore_from(dest, Path(out))
        if restored:
            logger.info("restored %d committed shards from %s", restored, dest.label)
    state = plan_shards.with_options(cache_policy=NO_CACHE)(
        str(settings.prompts), out, settings.shard_size)
    logger.info("plan %s: %d prompts in %d shards, %d pending", state.plan.fingerprint,
                state.plan.input_rows, state.plan.num_shards, len(state.pending))
    capacities: list[Capacity] = []
    stats_tokens = stats_done = stats_errors = 0
    started = time.monotonic()
    if state.pending:
        handles: list[ServerHandle] = []
        uploader = ShardUploader(dest, Path(out)) if dest is not None else None
        try:
            handles = launch_servers.with_options(cache_policy=NO_CACHE)(settings, out)
            took = wait_healthy.with_options(cache_policy=NO_CACHE)(
                handles, settings.api_key, settings.startup_timeout_s)
            logger.info("%d servers healthy after %.1f s", len(handles), took)
            capacities = measure_capacity.with_options(cache_policy=NO_CACHE)(
                handles, settings.api_key)
            create_table_artifact(
                key="fleet-capacity", description="servers: config and measured capacity",
                table=[{"server": c.url, "config": c.config, "sglang": c.version,
                        "max_running_requests": c.max_running_requests,
                        "max_total_num_tokens": c.max_total_num_tokens,
                        "max_mamba_cache_size": c.max_mamba_cache_size,
                        **settings.server.model_dump(exclude={"extra_args"},
                                                     exclude_none=True)} for c in capacities])
            for cap in capacities:
                logger.info("%s: max_running_requests=%d max_total_num_tokens=%d "
                            "max_mamba_cache_size=%s", cap.url, cap.max_running_requests,
                            cap.max_total_num_tokens, cap.max_mamba_cache_size)
            progress = _progress_reporter(state, logger, uploader)
            stats = generate_shards.with_options(cache_policy=NO_CACHE)(
                settings, state, capacities, progress)
            stats_tokens, stats_done, stats_errors = (stats.output_tokens, stats.completed,
                                                      stats.errors)
        finally:
            if handles:
                report = stop_servers.with_options(cache_policy=NO_CACHE)(
                    handles, out, settings.stop_grace_s)
                logger.info("stopped %d servers (SIGKILLed: %s, ports still busy: %s)",
                            report.stopped, report.killed or "none", report.ports_busy or "none")
            if uploader is not None and uploader.close():
                logger.warning("%d shard uploads failed; the final upload retries them",
                               uploader.failures)
    if target:
        rep = upload.with_options(cache_policy=NO_CACHE)(
            out, target, settings.storage.endpoint_url, settings.storage.region)
        logger.info("upload to %s: %d new, %d already there", rep.destination, rep.uploaded,
                    rep.skipped)
    summary = summarize(settings, state, capacities, stats_tokens, stats_done, stats_errors,
                        time.monotonic() - started)
    logger.info("done: %s", summary)
    return summary


def _progress_reporter(state: JobState, logger: Any, uploader: ShardUploader | None) -> Any:
    total = state.plan.num_shards
    done = total - len(state.pending)
    artifact_id = create_progress_artifact(
        progress=100.0 * done / total, key="generate-progress",
        description=f"{done}/{total} shards committed")
    assert isinstance(artifact_id, UUID)  # sync context: not a coroutine
    counter = {"done": done, "tokens": 0, "t0": time.monotonic()}
    last_update = [0.0]

    def on_commit(entry: ManifestEntry) -> None:
        if uploader is not None:
            uploader.submit(entry)
        counter["done"] += 1
        counter["tokens"] += entry.output_tokens
        elapsed = time.monotonic() - counter["t0"]
        tok_s = counter["tokens"] / elapsed if elapsed > 0 else 0.0
        this_run = counter["done"] - done
        eta = elapsed / this_run * (total - counter["done"]) if this_run else 0.0
        now = time.monotonic()
        if now - last_update[0] > 2.0 or counter["done"] == total:  # keep API calls coarse
            last_update[0] = now
            update_progress_artifact(
                artifact_id, progress=100.0 * counter["done"] / total,
                description=f"{counter['done']}/{total} shards, {tok_s:,.0f} tok/s (wall), "
                f"ETA {eta / 60:.1f} min")
        logger.info("shard %d committed (%d rows, %d errors) — %d/%d shards, %.0f tok/s",
                    entry.shard, entry.rows, entry.errors, counter["done"], total, tok_s)

    return on_commit


if __name__ == "__main__":
    print(generate())
