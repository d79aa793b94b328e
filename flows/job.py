"""What one run of the `generate` flow carries across its epochs: totals counted from commits,
the restart cycles, the hardware the policy reasons about, and the commit callback that
feeds the progress artifact, the log and the background upload.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any
from uuid import UUID

from prefect.artifacts import (
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from infra.input_lengths import InputLengths
from infra.ledger import ManifestEntry
from infra.settings import JobSettings
from infra.sglang.memory import MemoryPlan, PoolsDoNotFit, plan_memory
from infra.sglang.planner import Demand
from infra.sglang.profiles import GpuProfile, ModelProfile, gpu_profile, model_profile
from infra.sglang.versions import SGLangVersion, parse_version
from infra.sim.predict import Workload
from tasks.capacity import Capacity
from tasks.engines import engine_for
from tasks.shards import JobState
from tasks.tuning.answer_lengths import AnswerLengths
from tasks.tuning.policy import PrefixReuse
from tasks.upload import ShardUploader


@dataclass
class Cycle:
    """One restart: why, from what to what, and (once the next epoch is up) how long."""

    epoch: int
    measured_tok_s_per_gpu: float | None
    diagnosis: str
    reason: str
    old: str
    new_flags: dict[str, Any]
    new_concurrency: int | None
    predicted_tok_s_per_gpu: float | None = None  # for the new config, by the model
    triggered_at: float | None = None  # time.monotonic() of the trigger; not reported
    cycle_seconds: float | None = None  # trigger → the next fleet healthy
    startup_seconds: float | None = None  # the next fleet's start alone
    kind: str = "fleet"  # "fleet": stop all, relaunch; "canary": k servers first, then rolled
    canary: dict[str, Any] | None = None  # CanaryCycle.record() of a canary cycle

    def record(self) -> dict[str, Any]:
        """As the summary, the report and the tuning-ledger artifact show it."""
        out = asdict(self)
        out.pop("triggered_at")
        return {k: v for k, v in out.items()
                if v is not None or k not in ("cycle_seconds", "startup_seconds", "canary")}

    def next_fleet_up(self, startup_s: float) -> None:
        if self.triggered_at is not None:
            self.cycle_seconds = round(time.monotonic() - self.triggered_at, 2)
            self.startup_seconds = round(startup_s, 2)
            self.triggered_at = None


@dataclass
class RunTotals:
    """Counted from commits (what the ledger holds), not from answers: a shard cut short by
    a restart is redone, and its first answers are not counted twice."""

    tokens: int = 0
    done: int = 0
    errors: int = 0
    answers: int = 0  # every answer received, including those of shards redone after a drain
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the servers' prefix caches reused
    # prefix affinity primes groups on no_buffer servers (text or token-id prompts, affinity
    # on: tasks/affinity.py), so a move there keeps the reuse
    primes_groups: bool = False
    primers: int = 0  # primers sent (no_buffer servers)
    # Wall seconds the fleets took to come up, and spent generating (every epoch summed):
    # what a start-up costs beside the rate the servers held while they worked.
    startup_s: float = 0.0
    generating_s: float = 0.0
    capacities: list[Capacity] = field(default_factory=list)
    caps_by_epoch: dict[int, dict[str, int]] = field(default_factory=dict)  # for the report
    cycles: list[Cycle] = field(default_factory=list)
    advice: list[dict[str, Any]] = field(default_factory=list)  # engine=external: flows/advice.py
    input_lengths: InputLengths | None = None  # what the rows fix (infra/input_lengths.py)
    answer_lengths: AnswerLengths = field(default_factory=AnswerLengths)  # committed, sampled

    def prefix_reuse(self) -> PrefixReuse | None:
        return PrefixReuse.measured(self.prompt_tokens, self.cached_tokens, self.tokens,
                                    self.primes_groups)

    def demand(self, avg_context: float, generated_per_finished: float | None = None,
               max_new_tokens: int | None = None) -> Demand:
        """The job's own workload, to predict committed rates: the prompt's uncached tokens as
        committed so far, else as the token-id rows give them; the output's lengths as the
        rows fix them (ignore_eos: mean and p99 of their max_new_tokens), else the servers'
        tokens generated per request finished (`generated_per_finished`: the committed mean
        reads short while long answers run), else as committed so far. With either unknown
        (text rows before the first commit), the decode rate. Text rows' p99: the committed
        answers' (tasks/tuning/answer_lengths.py). No answer is longer than
        `max_new_tokens` (the job's, unless rows set their own): early in a job, with few
        requests finished and many long ones in flight, tokens per finished request can read
        past it (the canary scenarios' early overestimate, #26)."""
        fixed = self.input_lengths
        prompt = (max(1, round((self.prompt_tokens - self.cached_tokens) / self.done))
                  if self.done > 0 and self.prompt_tokens > 0
                  else fixed.prompt_tokens if fixed else None)
        if fixed is not None and fixed.output_tokens is not None:
            output, p99 = fixed.output_tokens, fixed.output_p99
        elif self.done > 0 and self.tokens > 0:
            committed_mean = self.tokens / self.done
            own = fixed is not None and fixed.rows_set_max_new_tokens
            longest = float(max_new_tokens) if max_new_tokens and not own else float("inf")
            output = max(1, round(min(longest, max(committed_mean,
                                                   generated_per_finished or 0.0))))
            tail = self.answer_lengths.p99(output)
            if tail is None:  # too few answers to see their spread: no move scored yet
                return Demand(avg_context)
            p99 = round(min(longest, tail))
        else:
            return Demand(avg_context)
        if prompt is None:
            return Demand(avg_context)
        # to two significant figures: a replay per candidate costs seconds, and a workload
        # that moves by a token with every commit would miss the predictor's cache each check
        p99 = _two_figures(p99) if p99 is not None else None
        output = _two_figures(output)
        return Demand(avg_context, Workload(_two_figures(prompt), output,
                                            p99 if p99 is not None and p99 > output else None))


def _two_figures(n: int) -> int:
    return max(1, int(float(f"{n:.2g}")))


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
    engine = engine_for(settings)
    gpu_name = engine.gpu_name(settings)
    version_text = settings.sglang_version or server_version
    try:
        model = model_profile(settings.model, settings.weights_gib)
        gpu = gpu_profile(gpu_name)
        version = parse_version(version_text) if version_text else None
    except ValueError:
        model = gpu = version = None  # type: ignore[assignment]
    return Hardware(model, gpu, version, engine.time_scale(settings))


def cycles_artifact(cycles: list[Cycle]) -> None:
    """The tuning-ledger table in the Prefect UI, rewritten after each cycle."""
    create_table_artifact(key="tuning-ledger", description="configs tried",
                          table=[c.record() for c in cycles])


def capacity_artifact(settings: JobSettings, caps: list[Capacity]) -> None:
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


class Progress:
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
