"""What one run of the `generate` flow shows as it goes: the commit callback that feeds the
progress artifact, the log, the totals and the background upload; the fleet-capacity table.
(The totals are tasks/totals.py; the restart cycles and the hardware are the tuner's.)
"""

from __future__ import annotations

import time
from typing import Any
from uuid import UUID

from prefect.artifacts import (
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from infra.manifest import ManifestEntry
from infra.sglang.flags import ServerFlags
from tasks.capacity import Capacity
from tasks.shards import JobState
from tasks.totals import RunTotals
from tasks.upload import ShardUploader


def capacity_artifact(flags: ServerFlags, capacities: list[Capacity]) -> None:
    create_table_artifact(
        key="fleet-capacity", description="servers: config and measured capacity",
        table=[capacity_row(flags, c) for c in capacities])


def capacity_row(flags: ServerFlags, cap: Capacity) -> dict[str, Any]:
    """One server's row: the flags as requested (prefixed), then what the server measured —
    a requested max_running_requests (256) must never stand in the measured column (85)."""
    requested = flags.model_dump(exclude={"extra_args"}, exclude_none=True)
    return {"server": cap.url, "config": cap.fingerprint, "sglang": cap.version,
            **{f"requested_{k}": v for k, v in requested.items()},
            "max_running_requests": cap.max_running_requests,
            "max_total_num_tokens": cap.max_total_num_tokens,
            "max_mamba_cache_size": cap.max_mamba_cache_size}


class Progress:
    """Commit callback: progress artifact (coarse updates), log line, background upload."""

    def __init__(self, state: JobState, logger: Any, uploader: ShardUploader | None,
                 totals: RunTotals) -> None:
        self.totals = totals
        self.total = state.shard_plan.num_shards
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

    def __call__(self, entry: ManifestEntry, lengths: list[int]) -> None:
        self.totals.answer_lengths.add(lengths)
        if self.uploader is not None:
            self.uploader.submit(entry)
        self.done += 1
        self.tokens += entry.output_tokens
        self.totals.tokens += entry.output_tokens
        self.totals.done += entry.rows
        self.totals.errors += entry.errors
        self.totals.prompt_tokens += entry.prompt_tokens
        self.totals.cached_tokens += entry.cached_tokens
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
