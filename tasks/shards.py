"""Plan shards from the input, then generate the pending ones and commit each when complete.

The plan depends only on the input ids and shard_size, never on servers, flags or
concurrency, so a run resumed after reconfiguring the fleet finds the same shards; what is
pending is the plan minus the manifest.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from infra.lease import LeaseLost, check_owned
from infra.manifest import Manifest, ManifestEntry, ShardPlan, make_plan
from infra.prompt_row import PromptRow
from infra.prompts import iter_rows, open_input, out_of_vocabulary, validate_input
from infra.settings import JobSettings
from infra.sglang.profiles import model_profile
from infra.termination import until_done_or_stopped
from tasks.capacity import Capacity, client_limit
from tasks.dispatch import Dispatcher, DispatchOptions, DispatchStats, Endpoint
from tasks.first_batch import (
    FleetCannotServe,
    forget_failure,
    record_failure,
    recorded_failure,
)
from tasks.fleet_config import FleetConfig
from tasks.fleet_control import FleetControl
from tasks.requests import RequestShapes
from tasks.run_ends import OutputTakenOver, writing_output


@dataclass(frozen=True)
class JobState:
    """Where a job stands before generating: the plan and what is left."""

    output: str
    shard_plan: ShardPlan
    pending: list[int]
    committed_rows: int
    removed_strays: int
    input_kind: str = "prompt"  # prompt | messages | input_ids (infra.prompts)


def prepare_job(prompts: Path, output: Path, shard_size: int) -> JobState:
    """Validate input (before any GPU time), fix or check the plan, clean strays."""
    summary = validate_input(prompts)
    manifest = Manifest(output)
    shard_plan = manifest.init_plan(make_plan(summary, shard_size))
    removed = manifest.remove_strays()
    committed = manifest.committed()
    pending = [s for s in range(shard_plan.num_shards) if s not in committed]
    rows = sum(e.rows + e.errors for e in committed.values())
    return JobState(str(output), shard_plan, pending, rows, len(removed), summary.kind)


def iter_pending_shards(shard_plan: ShardPlan, pending: list[int],
                        ) -> Iterator[tuple[int, list[PromptRow]]]:
    """Rows of each pending shard, reading the input once from the first pending shard."""
    if not pending:
        return
    wanted = set(pending)
    first = min(pending)
    start, _ = shard_plan.rows_of(first)
    current: list[PromptRow] = []
    shard = first
    rows = iter_rows(Path(shard_plan.input_path), start, shard_plan.input_rows,
                     id_dtype=shard_plan.id_dtype)
    for offset, row in enumerate(rows):
        row_shard = (start + offset) // shard_plan.shard_size
        if row_shard != shard:
            if shard in wanted:
                yield shard, current
            current, shard = [], row_shard
        if row_shard in wanted:
            current.append(PromptRow.from_columns(row))
    if shard in wanted:
        yield shard, current


# (the shard's entry, and its answers' lengths: tasks/tuning/answer_lengths.py)
OnCommit = Callable[[ManifestEntry, list[int]], None]


def endpoint_of(config: FleetConfig, queue_target: int, cap: Capacity) -> Endpoint:
    """How the dispatcher sees one server: its name, URL, in-flight limit, what it runs."""
    flags = config.flags
    return Endpoint(name=f"server-{cap.index}", url=cap.url,
                    limit=client_limit(cap, config.concurrency, queue_target),
                    fingerprint=cap.fingerprint, version=cap.version, primes_prefixes=(
                        flags.mamba_strategy == "no_buffer" and not flags.disable_radix_cache))


def model_vocab_size(model: str, weights_gib: float | None) -> int | None:
    """The vocabulary token ids are checked against; None for a model without a profile
    (`vocabulary_warning` tells the user before the run)."""
    try:
        return model_profile(model, weights_gib).vocab_size
    except ValueError:
        return None


def vocabulary_warning(settings: JobSettings) -> str | None:
    """Before the run: rows whose token ids real SGLang would die on, or ids left unchecked."""
    vocab = model_vocab_size(settings.model, settings.weights_gib)
    if vocab is None:
        kind = open_input(settings.prompts)[2]
        return (f"model: {settings.model!r} has no known vocab_size; token ids go unchecked "
                "(an id outside the vocabulary kills a real SGLang server): give a path to its "
                "config.json") if kind == "input_ids" else None
    bad, first = out_of_vocabulary(settings.prompts, vocab)
    return (f"prompts: {bad} rows carry token ids outside the model's vocabulary "
            f"(0..{vocab - 1}; the first: id {first!r}); they are recorded as errors, not sent"
            ) if bad else None


def generate_pending(settings: JobSettings, state: JobState, capacities: list[Capacity],
                     shapes: RequestShapes, on_commit: OnCommit | None = None,
                     stop: threading.Event | None = None,
                     control: FleetControl | None = None) -> DispatchStats:
    """Dispatch every pending shard across the fleet; commit shards as they complete.
    `shapes` are the run's engine's: how a row becomes its request and an answer columns."""
    manifest = Manifest(Path(state.output))
    config = FleetConfig.of(settings)
    endpoints = [endpoint_of(config, settings.client.queue_target, c) for c in capacities]
    flags_key = settings.server.fingerprint()
    s = settings.sampling
    opts = DispatchOptions(
        model=settings.model,
        api_key=settings.api_key.get_secret_value() if settings.api_key else None,
        sampling={"max_new_tokens": s.max_new_tokens, "temperature": s.temperature,
                  "top_p": s.top_p, "seed": s.seed, "ignore_eos": s.ignore_eos,
                  "stop": list(s.stop)},
        request_timeout_s=settings.client.request_timeout_s,
        max_attempts=settings.client.max_attempts,
        backoff_s=settings.client.backoff_s,
        samples=s.n,
        keep_input_columns=settings.keep_input_columns,
        prefix_key_chars=settings.client.prefix_affinity_chars,
        vocab_size=model_vocab_size(settings.model, settings.weights_gib),
        shapes=shapes,
        first_batch_relaunches=0 if recorded_failure(Path(state.output), flags_key) else 1,
    )

    async def commit(shard: int, rows: list[dict[str, Any]],
                     errors: list[dict[str, Any]]) -> None:
        output = Path(state.output)
        try:
            check_owned(output)  # a run whose folder was taken over writes nothing more
        except LeaseLost as exc:
            raise OutputTakenOver(str(exc)) from exc
        with writing_output(f"shard {shard}", output):
            entry = await asyncio.to_thread(manifest.commit_shard, state.shard_plan, shard,
                                            rows, errors)
        if on_commit is not None:
            # Off the loop: Prefect's artifact calls turn into coroutines (never awaited, so
            # the progress bar never moved) when called from inside a running event loop.
            lengths = [int(r.get("completion_tokens") or 0) for r in rows]
            await asyncio.to_thread(on_commit, entry, lengths)

    async def main() -> DispatchStats:
        stop_event = asyncio.Event()
        dispatcher = Dispatcher(endpoints, opts, commit, stop_event,
                                settings.tuning.drain_timeout_s)
        watcher = None
        if stop is not None:
            async def watch() -> None:
                while not stop.is_set():
                    await asyncio.sleep(0.05)
                stop_event.set()
            watcher = asyncio.create_task(watch())
        if control is not None:
            control.bind(dispatcher)
        try:
            return await until_done_or_stopped(
                dispatcher.run(iter_pending_shards(state.shard_plan, state.pending)))
        finally:
            if control is not None:
                control.unbind()
            if watcher is not None:
                watcher.cancel()

    try:
        stats = asyncio.run(main())
    except FleetCannotServe as exc:  # the next run with these flags stops at the first deaths
        record_failure(Path(state.output), flags_key, exc.deaths)
        raise
    forget_failure(Path(state.output))  # these servers served: the record no longer holds
    return stats


@task(name="plan_shards", cache_policy=NO_CACHE, retries=0)
def plan_shards(prompts: str, output: str, shard_size: int) -> JobState:
    with writing_output("the shard plan", Path(output)):
        return prepare_job(Path(prompts), Path(output), shard_size)


@task(name="generate_shards", cache_policy=NO_CACHE, retries=0)
def generate_shards(settings: JobSettings, state: JobState, capacities: list[Capacity],
                    shapes: RequestShapes, on_commit: OnCommit | None = None,
                    stop: threading.Event | None = None,
                    control: FleetControl | None = None) -> DispatchStats:
    return generate_pending(settings, state, capacities, shapes, on_commit, stop, control)
