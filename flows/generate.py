"""The `generate` flow: the seeds' manual loop as one restartable Prefect flow.

plan shards → [launch servers → wait healthy → measure capacity → generate shards (watched)
→ stop] → upload. When the watch finds a better configuration (or a regression, or a slower
config to roll back), the bracket repeats with new flags: drain, stop, relaunch, resume. The
output folder's manifest is the only record of what is done, so a rerun of the flow resumes
where it stopped.
The fleet is stopped on every exit path: `finally` for errors, hooks for cancellation and
crashes, PDEATHSIG if this process dies.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from flows.epoch import JobContext, run_epoch
from flows.progress import Progress
from flows.report import write_report
from flows.summary import RunSummary, ServerSummary, format_summary
from infra.bucket_lease import leases_beside
from infra.input_lengths import InputLengths, sample_lengths
from infra.lease import FolderLease, LeaseStore, held_lease, in_use_problem
from infra.locations import location_problem
from infra.processes import ephemeral_port_warning
from infra.prompts import validate_input
from infra.settings import (
    NULL,
    JobSettings,
    SamplingSettings,
    StorageSettings,
    load_settings,
)
from infra.storage import Destination, StorageError, open_destination
from infra.termination import deliver_pending_stop, latched_stop_signals
from tasks.capacity import capacity_note
from tasks.engines import build_engine, model_is_hybrid
from tasks.feed import starved_times
from tasks.monitor import FleetMonitor
from tasks.run_ends import DISK_ERRNOS, BucketUnreachable, free_space_note, writing_output
from tasks.shards import JobState, plan_shards, vocabulary_warning
from tasks.totals import RunTotals
from tasks.tuning.ledger import TuningLedger
from tasks.tuning.policy import pools_pinned
from tasks.tuning.tuner import Tuner
from tasks.upload import UploadReport, restore_from, upload


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


def leases_of(settings: JobSettings, node: str | None) -> tuple[Path, list[LeaseStore]]:
    """The folder whose lease the run holds, and those it holds beside it: where it
    publishes, for a whole job (a node of a multi-node job publishes into the output whose
    lease its generate-fleet run holds)."""
    out, target = settings.node_paths(node)
    if node is not None:
        return out, []
    return out, leases_beside(target, settings.storage.endpoint_url, settings.storage.region)


def lease_problem(settings: JobSettings, node: str | None) -> str | None:
    """The refusal a live owner of the output (or of where it publishes) gives."""
    if settings.force_takeover:
        return None
    out, beside = leases_of(settings, node)
    return next(filter(None, map(in_use_problem, [FolderLease(out), *beside])), None)


def preflight(settings: JobSettings, check_input: bool = True,
              node: str | None = None) -> list[str]:
    """Everything that can be checked before a server starts or an output folder appears:
    the input file, the launch commands (version-aware flags), the sim's profiles. Raises
    ValueError subclasses whose message names the field and the fix; returns warnings (legal
    settings that are likely to hurt)."""
    if check_input:  # the flow skips it: plan_shards validates before any server starts
        validate_input(settings.prompts)
    engine = build_engine(settings)
    specs = engine.launch_specs(settings.server, settings.local_output())
    engine.check_before_start()
    problem = location_problem(settings) or lease_problem(settings, node)
    if problem:
        raise ValueError(problem)
    warnings = [w for w in [ephemeral_port_warning([s.port for s in specs]),
                            vocabulary_warning(settings) if check_input else None] if w]
    hybrid = model_is_hybrid(settings.model, settings.weights_gib)
    if (settings.servers_per_gpu > 1 and settings.tuning.enabled
            and not pools_pinned(settings.server, hybrid)):
        warnings.append(f"servers_per_gpu={settings.servers_per_gpu}: tuning is off, because "
                        "the memory model plans whole GPUs; pin each server's pools "
                        "(server.max_total_tokens, and server.max_mamba_cache_size on a hybrid "
                        "model) to let it try moves that keep them")
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
    # (no handles: the engine stops what the output's registry lists, if it owns servers)
    build_engine(settings).stop([], settings.node_paths(node)[0])


def summarize(tuner: Tuner, state: JobState, totals: RunTotals, seconds: float) -> RunSummary:
    settings, capacities = tuner.settings, tuner.capacities
    wall_tok_s = totals.tokens / seconds if seconds > 0 else 0.0
    time_scale = tuner.time_scale
    return RunSummary(
        output=settings.upload_target() or str(settings.local_output()),
        prompts_total=state.shard_plan.input_rows, prompts_done_this_run=totals.done,
        errors_this_run=totals.errors, already_committed=state.committed_rows,
        output_tokens=totals.tokens, seconds=round(seconds, 2), tok_s=round(wall_tok_s, 1),
        tok_s_modeled_gpu_time=round(wall_tok_s / time_scale, 1), time_scale=time_scale,
        startup_s=round(totals.startup_s, 2), generating_s=round(totals.generating_s, 2),
        client_starved_s=round(sum(b - a for a, b in starved_times(
            tuner.state.monitor.feed_snapshot())), 1),
        servers=[ServerSummary(url=c.url, max_running_requests=c.max_running_requests,
                               max_total_num_tokens=c.max_total_num_tokens,
                               max_mamba_cache_size=c.max_mamba_cache_size) for c in capacities],
        capacity_note=capacity_note(tuner.memory_plan() if capacities else None, capacities),
        restarts=len(tuner.cycles),
        answers_redone_after_drains=max(0, totals.answers - totals.done - totals.errors),
        cycles=[c.record() for c in tuner.cycles],
        final_server_flags=settings.server.model_dump(exclude_none=True,
                                                      exclude={"extra_args"}),
        prompt_tokens=totals.prompt_tokens, cached_tokens=totals.cached_tokens,
        prefix_affinity_chars=settings.client.prefix_affinity_chars,
        client_concurrency=settings.client.concurrency_per_server, primers=totals.primers,
        advice=tuner.advice)


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
    for warning in preflight(settings, check_input=False, node=node):
        logger.warning(warning)
    if "api_key" in (overrides or {}):
        logger.warning("api_key came as a flow parameter: Prefect keeps parameters in plain "
                       "text in its database; set EXPANSION_API_KEY in the environment of the "
                       "worker (or the deployment's job_variables env) instead")
    out, beside = leases_of(settings, node)
    _, target = settings.node_paths(node)
    with latched_stop_signals(), held_lease(out, str(flow_run.name or ""),
                                            settings.force_takeover, beside):
        return _generate_into(settings, out, target, shards, node, logger)


def _generate_into(settings: JobSettings, out: Path, target: str | None,
                   shards: list[int] | None, node: str | None, logger: Any) -> dict[str, Any]:
    """The job, once this run holds the output folder's lease: restore, plan, epochs,
    report, upload."""
    manifest_key = f"manifests/{node}.jsonl" if node else "manifest.jsonl"
    dest: Destination | None = None
    if target:
        dest = open_destination(target, settings.storage.endpoint_url, settings.storage.region,
                                settings.storage.multipart_mb)
        try:  # before any server starts: a bucket out of reach is said now, not at the end
            restored = restore_from(dest, out) if node is None else 0
        except StorageError as exc:
            raise BucketUnreachable(str(exc)) from exc
        if restored:
            logger.info("restored %d committed shards from %s", restored, dest.label)
    state = _pending_state(str(settings.prompts), settings.shard_size, out, shards)
    logger.info("plan %s: %d prompts in %d shards, %d pending", state.shard_plan.fingerprint,
                state.shard_plan.input_rows, state.shard_plan.num_shards, len(state.pending))
    if state.removed_strays:
        logger.info("removed %d shard files an interrupted run left without a manifest entry "
                    "(they are regenerated)", state.removed_strays)
    initial = state
    totals = RunTotals(primes_groups=settings.client.prefix_affinity_chars > 0
                       and state.input_kind != "messages")
    if settings.tuning.enabled and state.pending:
        totals.input_lengths = _input_lengths(settings.sampling, state)
        logger.info("workload the input fixes (%d rows sampled): %s",
                    totals.input_lengths.rows_sampled, totals.input_lengths.describe())
    started = time.monotonic()
    engine = build_engine(settings)
    monitor = FleetMonitor(settings.tuning.sample_interval_s, engine.api_key, engine.metrics)
    tuner = Tuner(settings, engine, TuningLedger(out / "tuning.jsonl"), monitor, totals,
                  logger)
    if state.pending:
        monitor.start()
        try:
            ctx = JobContext(out, dest, monitor, totals, logger, manifest_key if node else None,
                             Progress(state, logger, None, totals))
            _run_epochs(state, ctx, tuner, shards)
        finally:
            monitor.stop()
            _keep_series(monitor, out, logger)
    settings = tuner.settings
    summary = summarize(tuner, initial, totals, time.monotonic() - started)
    if tuner.capacities:
        with writing_output("the run report", out):
            _, artifact = write_report(out, summary, monitor.snapshot(), summary.cycles,
                                       tuner.time_scale, tuner.caps_by_epoch)
        create_markdown_artifact(artifact, key="run-report",
                                 description="throughput, pool usage and restarts")
    if target:  # after the report: the bucket gets it, with the tuning ledger, series and logs
        rep = _final_upload(settings.storage, out, target, manifest_key, node)
        logger.info("upload to %s: %d new, %d already there", rep.destination, rep.uploaded,
                    rep.skipped)
    logger.info(format_summary(summary))
    return summary.model_dump()


def _keep_series(monitor: FleetMonitor, out: Path, logger: Any) -> None:
    """Write the fleet's time series; a disk that refuses it loses the series, not the run's
    end (the shards, and the error that says why the disk refused, come first)."""
    try:
        monitor.write(out / "monitor" / f"metrics-{int(time.time())}.parquet")
    except OSError as exc:
        if exc.errno not in DISK_ERRNOS:
            raise
        logger.warning("the fleet's time series was not written: %s (%s)", exc.strerror,
                       free_space_note(out))


def _final_upload(store: StorageSettings, out: Path, target: str, manifest_key: str,
                  node: str | None) -> UploadReport:
    """The final verified upload, retried at `storage.upload_retry_delays_s`; a bucket still
    unreachable after them ends the run as BucketUnreachable (every shard is committed
    locally, and the same command uploads what the bucket lacks)."""
    delays = list(store.upload_retry_delays_s)
    try:
        return upload.with_options(retries=len(delays), retry_delay_seconds=delays)(
            str(out), target, store.endpoint_url, store.region, manifest_key,
            store.multipart_mb, f"nodes/{node}/" if node else "")
    except StorageError as exc:
        raise BucketUnreachable(f"{exc} (after {len(delays) + 1} tries)") from exc


def _run_epochs(state: JobState, ctx: JobContext, tuner: Tuner,
                shards: list[int] | None) -> None:
    """Run fleet configurations until no shard is pending; the tuner chooses each one."""
    epoch = tuner.first_epoch - 1  # a resumed job's epochs follow the ones its ledger holds
    while state.pending:
        deliver_pending_stop()  # a stop signal Python dropped ends the run, not the epoch
        epoch += 1
        outcome = run_epoch(state, ctx, tuner, epoch)
        state = _pending_state(str(tuner.settings.prompts), tuner.settings.shard_size, ctx.out,
                               shards)
        tuner.after_epoch(epoch, outcome.result, outcome.start_failure, bool(state.pending))


def _input_lengths(sampling: SamplingSettings, state: JobState) -> InputLengths:
    """The lengths the rows fix, for the tuner's first predictions (infra/input_lengths.py)."""
    shard_plan = state.shard_plan
    return sample_lengths(Path(shard_plan.input_path), shard_plan.input_rows, shard_plan.id_dtype,
                          sampling.max_new_tokens, sampling.ignore_eos)


def _pending_state(prompts: str, shard_size: int, out: Path,
                   shards: list[int] | None) -> JobState:
    """What is left, from the manifest (the only record of what is done); a node keeps to its
    shards."""
    state = plan_shards(prompts, str(out), shard_size)
    if shards is None:
        return state
    owned = set(shards)
    return replace(state, pending=[s for s in state.pending if s in owned])


if __name__ == "__main__":
    print(generate())
