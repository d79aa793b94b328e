"""Diagnose a slow fleet, propose the next configuration, and decide when to restart.

The seeds' loop, as pure functions: `window_stats` (what the servers did lately) →
`diagnose` (why it is slow, with evidence) → `propose` (the next server flags and client
concurrency, from the memory model and a ledger of what was tried) → `RegressionWatch`
(when to stop dispatch and restart, or roll back).
"""

from __future__ import annotations

import json
import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from prefect import task
from prefect.cache_policies import NO_CACHE

from infra.files import read_jsonl
from infra.sglang.flags import ServerFlags
from infra.sglang.memory import MemoryPlan, PoolsDoNotFit, plan_memory
from infra.sglang.planner import MAX_MEM_FRACTION, candidate_flags, predict_tok_s
from infra.sglang.profiles import GpuProfile, ModelProfile
from infra.sglang.versions import SGLangVersion
from tasks.monitor import FleetMonitor, Sample

Kind = Literal["mamba-bound", "kv-bound", "client-bound", "compute-bound", "unhealthy",
               "asymmetric", "idle"]


@dataclass(frozen=True)
class ServerWindow:
    server: str
    alive: bool
    running: float
    queued: float
    kv_usage: float | None
    mamba_usage: float | None
    tok_s: float  # modeled GPU-time tokens/s over the window


@dataclass(frozen=True)
class Diagnosis:
    kind: Kind
    evidence: str
    tok_s_per_gpu: float
    servers: list[ServerWindow] = field(default_factory=list)


def _rate(rows: list[Sample], time_scale: float) -> float:
    """A server's tokens/s (modeled GPU time) over some samples.

    The server's own decode throughput gauge is preferred: it is continuous, where the
    finished-tokens counter moves in bursts as requests complete."""
    gauges = [r.gen_throughput for r in rows if r.gen_throughput is not None]
    if gauges:
        return statistics.fmean(gauges)
    counters = [(r.t, r.generation_tokens_total) for r in rows
                if r.generation_tokens_total is not None]
    if len(counters) >= 2 and counters[-1][0] > counters[0][0]:
        return ((counters[-1][1] - counters[0][1]) / (counters[-1][0] - counters[0][0])
                / time_scale)
    return 0.0


def window_stats(samples: list[Sample], since: float, time_scale: float) -> list[ServerWindow]:
    """Per-server means over samples at t ≥ since."""
    by_server: dict[str, list[Sample]] = {}
    for s in samples:
        if s.t >= since:
            by_server.setdefault(s.server, []).append(s)
    out = []
    for name, rows in sorted(by_server.items()):
        live = [r for r in rows if r.alive]

        def mean(values: list[float | int | None]) -> float | None:
            vals = [float(v) for v in values if v is not None]
            return statistics.fmean(vals) if vals else None

        out.append(ServerWindow(name, rows[-1].alive, mean([r.running for r in live]) or 0.0,
                                mean([r.queued for r in live]) or 0.0,
                                mean([r.kv_usage for r in live]),
                                mean([r.mamba_usage for r in live]), _rate(live, time_scale)))
    return out


def steady_tok_s_per_gpu(samples: list[Sample], since: float, time_scale: float,
                         ) -> float | None:
    """Median over sampling ticks (after `since`, while the fleet was busy) of the mean
    per-server throughput: robust to the job's tail, when the fleet runs out of work."""
    per_tick: dict[float, list[Sample]] = {}
    for s in samples:
        if s.t >= since and s.alive and (s.running or 0) > 0:
            per_tick.setdefault(round(s.t, 1), []).append(s)
    ticks = [statistics.fmean(_rate([r], time_scale) for r in rows)
             for rows in per_tick.values() if rows]
    return statistics.median(ticks) if len(ticks) >= 3 else None


@dataclass(frozen=True)
class PoolView:
    """Which pool sets the running-request cap, and how (from a plan or a live server)."""

    binding_limit: str
    mamba_slots: int | None = None
    slot_ratio: int | None = None
    mamba_strategy: str | None = None

    @classmethod
    def of(cls, plan: MemoryPlan | None) -> PoolView | None:
        if plan is None:
            return None
        return cls(plan.binding_limit, plan.mamba_slots, plan.slot_ratio, plan.mamba_strategy)

    def how(self) -> str:
        if self.mamba_slots and self.slot_ratio:
            return (f"{self.mamba_slots} slots / {self.slot_ratio} per request under "
                    f"{self.mamba_strategy or 'its strategy'}")
        return "cap = mamba slots / slots per request"


def diagnose(windows: list[ServerWindow], caps: dict[str, int],
             pools: MemoryPlan | PoolView | None) -> Diagnosis:
    """Why the fleet runs at its speed, from the window and the servers' caps.

    `caps` is each server's max_running_requests; `pools` says which pool sets the cap
    (the memory model's plan, or what a live server's numbers imply)."""
    plan = pools if isinstance(pools, PoolView) or pools is None else PoolView.of(pools)
    if not windows:
        return Diagnosis("idle", "no samples yet", 0.0)
    per_gpu = statistics.fmean(w.tok_s for w in windows)
    dead = [w.server for w in windows if not w.alive]
    if dead:
        return Diagnosis("unhealthy", f"no /metrics answer from {', '.join(dead)}", per_gpu,
                         windows)
    speeds = [w.tok_s for w in windows]
    median = statistics.median(speeds)
    slow = [w for w in windows if median > 0 and w.tok_s < 0.75 * median]
    if len(windows) > 1 and slow:
        names = ", ".join(f"{w.server} {w.tok_s:,.0f} tok/s" for w in slow)
        return Diagnosis("asymmetric", f"{names} vs a median of {median:,.0f} tok/s: a GPU "
                         "unlike the others (check that server's log and nvidia-smi)",
                         per_gpu, windows)
    running = statistics.fmean(w.running for w in windows)
    queued = statistics.fmean(w.queued for w in windows)
    cap = statistics.fmean(caps.values()) if caps else 0.0
    kv = _mean_opt([w.kv_usage for w in windows])
    mamba = _mean_opt([w.mamba_usage for w in windows])
    at_cap = cap > 0 and running >= 0.9 * cap
    usage = (f"running {running:.1f} of cap {cap:.0f}, queue {queued:.1f}, KV "
             f"{_pct(kv)}, mamba {_pct(mamba)}")
    if not at_cap and queued < 1:
        return Diagnosis("client-bound", f"{usage}: servers have free slots and nothing "
                         "queued — raise client concurrency", per_gpu, windows)
    if at_cap and plan is not None and plan.binding_limit == "mamba" and (kv or 0) < 0.5:
        low = ""
        if mamba is not None and mamba < 0.5:
            # SGLang counts live states; the cap reserves ρ slots per request (reference §2.5).
            low = (f"; mamba usage reads {_pct(mamba)} because it counts live states, not the "
                   "slots each request reserves")
        return Diagnosis("mamba-bound", f"{usage}: the cap comes from the mamba pool "
                         f"({plan.how()}) while KV sits mostly empty{low}", per_gpu, windows)
    if (kv or 0) >= 0.85 or (plan is not None and plan.binding_limit == "kv" and at_cap):
        return Diagnosis("kv-bound", f"{usage}: the KV pool is the limit", per_gpu, windows)
    return Diagnosis("compute-bound", f"{usage}: at the cap with pool headroom; more memory "
                     "will not help", per_gpu, windows)


def _mean_opt(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def pools_from_caps(max_running: int | None, mamba_slots: int | None,
                    strategy: str | None) -> PoolView | None:
    """The mamba pool binds when a server's cap equals its mamba slots / ρ: what a plan would
    say, read off a live server or a log that does not name its GPU or model."""
    if not max_running or not mamba_slots:
        return None
    ratios = {"no_buffer": (3,), "extra_buffer": (5, 4), "extra_buffer_lazy": (4,)}
    for rho in ratios.get(strategy or "", (3, 4, 5)):
        if max_running == mamba_slots // rho:
            return PoolView("mamba", mamba_slots, rho, strategy)
    return None


def samples_from_log(records: list[dict[str, object]], server: str) -> list[Sample]:
    """Decode lines of a server log as monitor samples (t in seconds from the first line)."""
    from datetime import datetime

    out: list[Sample] = []
    t0: datetime | None = None
    for r in records:
        if r.get("kind") != "decode" or not r.get("timestamp"):
            continue
        try:
            ts = datetime.fromisoformat(str(r["timestamp"]).replace(",", "."))
        except ValueError:
            continue
        t0 = t0 or ts
        kv = r.get("full_token_usage") if r.get("full_token_usage") is not None else r.get(
            "token_usage")
        out.append(Sample((ts - t0).total_seconds(), 1, server, True,
                          _opt_int(r.get("running_req")), _opt_int(r.get("queue_req")),
                          _opt_float(kv), _opt_float(r.get("mamba_usage")),
                          _opt_float(r.get("gen_throughput")), None))
    return out


def _opt_int(value: object) -> int | None:
    return int(value) if isinstance(value, (int, float)) else None


def _opt_float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


# --- the tuning ledger ----------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerEntry:
    epoch: int
    flags: dict[str, object]
    fingerprint: str
    concurrency: int | None
    outcome: Literal["measured", "failed", "rolled_back"]
    tok_s_per_gpu: float | None
    predicted_tok_s_per_gpu: float | None
    reason: str
    at: float


class TuningLedger:
    """Configurations tried in this job, with what they did (tuning.jsonl in the output)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def entries(self) -> list[LedgerEntry]:
        return read_jsonl(self.path, LedgerEntry)

    def record(self, entry: LedgerEntry) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(asdict(entry)) + "\n")

    def tried(self) -> set[str]:
        return {e.fingerprint for e in self.entries()}

    def flags_of(self, entry: LedgerEntry) -> ServerFlags:
        return ServerFlags.model_validate(entry.flags)

    def best(self) -> LedgerEntry | None:
        measured = [e for e in self.entries() if e.outcome == "measured" and e.tok_s_per_gpu]
        return max(measured, key=lambda e: e.tok_s_per_gpu or 0.0) if measured else None


def config_key(flags: ServerFlags, concurrency: int | None) -> str:
    """Ledger identity of a configuration: server flags plus client concurrency."""
    return f"{flags.fingerprint()}|{concurrency}"


# --- the policy ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proposal:
    flags: ServerFlags
    concurrency: int | None  # None: each server's cap + queue_target
    predicted_tok_s_per_gpu: float | None
    reason: str


def _combined_moves(model: ModelProfile, flags: ServerFlags, plan: MemoryPlan | None,
                    mem_ceiling: float) -> list[tuple[str, ServerFlags]]:
    """Two-lever moves worth trying for throughput jobs, beyond the single levers."""
    if not model.hybrid:
        return []
    m = min(mem_ceiling, max(flags.mem_fraction_static or 0.0, 0.90))
    ratio = flags.mamba_full_memory_ratio or 0.9
    out = [("no_buffer + mem fraction + MRR 256", flags.with_changes(
        mamba_strategy="no_buffer", mem_fraction_static=m, max_running_requests=256,
        max_mamba_cache_size=None))]
    if plan is not None and plan.binding_limit == "mamba":
        out.append(("more mamba share + mem fraction", flags.with_changes(
            mamba_full_memory_ratio=round(ratio * 2, 3), mem_fraction_static=m,
            max_running_requests=256, max_mamba_cache_size=None)))
        out.append(("no_buffer + more mamba share + mem fraction", flags.with_changes(
            mamba_strategy="no_buffer", mamba_full_memory_ratio=round(ratio * 2, 3),
            mem_fraction_static=m, max_running_requests=256, max_mamba_cache_size=None)))
    if flags.speculative and plan is not None and plan.binding_limit == "mamba":
        slots = (flags.max_mamba_cache_size or plan.mamba_slots) * 2
        out.append((f"mamba slots {plan.mamba_slots}→{slots} + ratio + mem fraction",
                    flags.with_changes(max_mamba_cache_size=slots, mem_fraction_static=m,
                                       mamba_full_memory_ratio=round(ratio * 1.5, 3),
                                       max_running_requests=max(64, slots // plan.slot_ratio))))
    return out


def propose(diagnosis: Diagnosis, flags: ServerFlags, concurrency: int | None,
            model: ModelProfile, gpu: GpuProfile, version: SGLangVersion, tried: set[str],
            mem_ceiling: float = MAX_MEM_FRACTION, avg_context: float = 2048.0,
            min_gain: float = 1.1, allow_lossy: bool = False) -> Proposal | None:
    """The next configuration to try, or None when nothing promises a gain.

    Never repeats a ledger entry; keeps mem_fraction_static under `mem_ceiling` (lowered
    after an OOM); keeps MTP unless the model predicts that dropping it wins; never changes
    numerics (SSM state or KV dtype) unless `allow_lossy` — a data-generation job should not
    get different outputs because the tuner wanted speed."""
    if diagnosis.kind == "client-bound":
        if concurrency is None or config_key(flags, None) in tried:
            return None  # already cap + queue: the fleet is just running out of work
        return Proposal(flags, None, None, "client-bound: set client concurrency to each "
                        "server's cap plus a small queue")
    if diagnosis.kind not in ("mamba-bound", "kv-bound", "compute-bound"):
        return None
    try:
        current = plan_memory(model, gpu, flags, version)
    except PoolsDoNotFit:
        current = None
    baseline = (predict_tok_s(model, gpu, flags, current, avg_context) if current else 0.0)
    options = candidate_flags(model, flags, current) + _combined_moves(model, flags, current,
                                                                       mem_ceiling)
    best: tuple[float, str, ServerFlags] | None = None
    for label, candidate in options:
        if config_key(candidate, None) in tried or candidate == flags:
            continue
        if not allow_lossy and (candidate.mamba_ssm_dtype != flags.mamba_ssm_dtype
                                or candidate.kv_cache_dtype != flags.kv_cache_dtype):
            continue
        if (candidate.mem_fraction_static or 0.0) > mem_ceiling:
            continue
        try:
            plan = plan_memory(model, gpu, candidate, version)
        except PoolsDoNotFit:
            continue
        tok_s = predict_tok_s(model, gpu, candidate, plan, avg_context)
        if best is None or tok_s > best[0]:
            best = (tok_s, label, candidate)
    if best is None or best[0] < min_gain * baseline:
        return None
    tok_s, label, chosen = best
    gain = tok_s / baseline if baseline else float("inf")
    return Proposal(chosen, None, tok_s,
                    f"{diagnosis.kind}: {label} — predicted {tok_s:,.0f} tok/s per GPU "
                    f"({gain:.2f}× the model's figure for the current config)")


# --- when to restart -------------------------------------------------------------------------


def required_gain(remaining_s: float, restart_cost_s: float, floor: float,
                  payback: float) -> float:
    """The least predicted speed-up for which a restart pays for itself.

    A restart costs `restart_cost_s` of fleet time (stop, start-up, drain, in-flight work
    redone); a speed-up g saves remaining_s × (1 − 1/g) on the work left. Require the saving
    to be `payback` × the cost, and g ≥ `floor` (below it the model's own error dominates).
    On a 40-hour job +5 % pays; near the end of a job nothing does (inf)."""
    if remaining_s <= 0:
        return math.inf
    share = payback * restart_cost_s / remaining_s
    if share >= 1.0:
        return math.inf
    return max(floor, 1.0 / (1.0 - share))


@dataclass
class WatchResult:
    triggered: bool = False
    reason: str = ""
    diagnosis: Diagnosis | None = None
    measured_tok_s_per_gpu: float | None = None
    triggered_at: float | None = None  # time.monotonic() of the trigger
    required_gain: float | None = None  # what a restart had to promise at the last check
    last_check: str = ""  # the last check's verdict, for the log when nothing triggered


class RegressionWatch:
    """Watches one epoch; sets `stop` when a restart would pay off (or a rollback is due).

    Triggers after `window_s` of steady state when (a) throughput stays below the target, or
    (b) the diagnosis is a pool/client limit and the policy has a proposal, or (c) this
    config is slower than the best earlier one (rollback)."""

    def __init__(self, monitor: FleetMonitor, caps: dict[str, int], plan: MemoryPlan | None,
                 time_scale: float, window_s: float, target_tok_s_per_gpu: float | None,
                 baseline_tok_s_per_gpu: float | None,
                 can_propose: Callable[[Diagnosis, float], Proposal | None] | None,
                 enabled: bool,
                 gain_needed: Callable[[Diagnosis], float] | None = None) -> None:
        self.monitor = monitor
        self.caps = caps
        self.plan = plan
        self.time_scale = time_scale
        self.window_s = window_s
        self.target = target_tok_s_per_gpu
        self.baseline = baseline_tok_s_per_gpu
        self.can_propose = can_propose  # (diagnosis, least gain) -> Proposal | None
        self.enabled = enabled
        self.gain_needed = gain_needed  # diagnosis -> least predicted gain worth a restart
        self.stop = threading.Event()
        self.result = WatchResult()
        self._slow_checks = 0
        self._done = threading.Event()
        self._started = monitor.now()
        self._thread = threading.Thread(target=self._run, name="regression-watch", daemon=True)

    def start(self) -> RegressionWatch:
        self._thread.start()
        return self

    def close(self) -> WatchResult:
        """Stop watching; the result's throughput is the median per-tick rate of the epoch
        after warm-up (robust to the job's tail, when the fleet runs out of work)."""
        self._done.set()
        self._thread.join(timeout=10)
        if not self.result.triggered:
            self._measure()
        steady = steady_tok_s_per_gpu(self.monitor.snapshot(), self._started + self.window_s / 2,
                                      self.time_scale)
        if steady is not None and not self.result.triggered:
            self.result.measured_tok_s_per_gpu = steady
        return self.result

    def _measure(self) -> Diagnosis:
        # Skip the first half window: admission ramp-up is not steady state.
        since = max(self._started + self.window_s / 2, self.monitor.now() - self.window_s)
        windows = window_stats(self.monitor.snapshot(), since, self.time_scale)
        diag = diagnose(windows, self.caps, self.plan)
        self.result.diagnosis = diag
        self.result.measured_tok_s_per_gpu = diag.tok_s_per_gpu if windows else None
        return diag

    def _run(self) -> None:
        first_check = self._started + 1.5 * self.window_s
        while not self._done.wait(min(1.0, self.window_s / 4)):
            if not self.enabled or self.monitor.now() < first_check:
                continue
            diag = self._measure()
            reason = self._reason(diag)
            if reason:
                self.result.triggered = True
                self.result.triggered_at = time.monotonic()
                self.result.reason = reason
                self.stop.set()
                return

    def _reason(self, diag: Diagnosis) -> str:
        tok = diag.tok_s_per_gpu
        need = self.gain_needed(diag) if self.gain_needed is not None else 1.0
        self.result.required_gain = need
        if self.baseline and tok < 0.95 * self.baseline and self.baseline >= need * tok:
            # Two checks in a row: one slow window can be ramp-up or a noisy neighbour.
            self._slow_checks += 1
            if self._slow_checks >= 2:
                return (f"rollback: {tok:,.0f} tok/s per GPU is slower than the best earlier "
                        f"config ({self.baseline:,.0f}) in two windows running")
            return ""
        self._slow_checks = 0
        if diag.kind == "unhealthy":
            return f"unhealthy: {diag.evidence}"
        below = self.target is not None and tok < self.target
        proposal = (self.can_propose(diag, need)
                    if self.can_propose is not None and math.isfinite(need) else None)
        self.result.last_check = (
            f"{diag.kind} at {tok:,.0f} tok/s per GPU ({diag.evidence}); a restart had to "
            f"promise ≥ {need:.2f}× to pay for itself over the work left; "
            + (f"best candidate: {proposal.reason}" if proposal is not None
               else "no candidate did"))
        if below and proposal is not None:
            return (f"{tok:,.0f} tok/s per GPU is below the target {self.target:,.0f}; "
                    f"{diag.kind}: {diag.evidence}")
        if proposal is not None and diag.kind in ("mamba-bound", "kv-bound", "client-bound"):
            return f"{diag.kind}: {diag.evidence}"
        return ""


def _resolved_mem_fraction(flags: ServerFlags, model: ModelProfile | None,
                           gpu: GpuProfile | None, version: SGLangVersion | None,
                           ) -> float | None:
    if flags.mem_fraction_static is not None:
        return flags.mem_fraction_static
    if model is None or gpu is None or version is None:
        return None
    try:
        return plan_memory(model, gpu, flags, version).mem_fraction_static
    except PoolsDoNotFit:
        return None


# --- the restart decision --------------------------------------------------------------------


@dataclass(frozen=True)
class NextConfig:
    flags: ServerFlags
    concurrency: int | None
    reason: str


def decide_next(result: WatchResult | None, failure: str | None, epoch: int,
                flags: ServerFlags, concurrency: int | None, ledger: TuningLedger,
                model: ModelProfile | None, gpu: GpuProfile | None,
                version: SGLangVersion | None, mem_ceiling: float, min_gain: float,
                avg_context: float, allow_lossy: bool = False,
                ) -> tuple[NextConfig | None, float]:
    """Record what this epoch did and choose the next configuration (None: keep going as is).

    Returns (next config or None, the possibly lowered mem_fraction ceiling)."""
    key = config_key(flags, concurrency)
    now = time.time()
    dump = flags.model_dump(mode="json")
    if failure is not None:
        ledger.record(LedgerEntry(epoch, dump, key, concurrency, "failed", None, None,
                                  failure[:500], now))
        failed_m = _resolved_mem_fraction(flags, model, gpu, version)
        if "out of memory" in failure.lower() and failed_m is not None:
            # Back off halfway to the largest fraction known to work (a bisection step).
            good = [m for m in (_resolved_mem_fraction(ledger.flags_of(e), model, gpu, version)
                                for e in ledger.entries() if e.outcome == "measured")
                    if m is not None and m < failed_m]
            floor = max(good) if good else failed_m - 0.1
            mem_ceiling = min(mem_ceiling, round((floor + failed_m) / 2, 3))
        best = ledger.best()
        if best is None:
            return None, mem_ceiling
        return NextConfig(ledger.flags_of(best), best.concurrency,
                          f"start failed ({failure.splitlines()[0][:160]}); back to the best "
                          f"config so far ({best.tok_s_per_gpu:,.0f} tok/s per GPU); "
                          f"mem_fraction_static ceiling now {mem_ceiling}"), mem_ceiling
    measured = result.measured_tok_s_per_gpu if result else None
    if result is not None and result.triggered and result.reason.startswith("rollback"):
        ledger.record(LedgerEntry(epoch, dump, key, concurrency, "rolled_back", measured, None,
                                  result.reason, now))
        best = ledger.best()
        if best is None:
            return None, mem_ceiling
        return NextConfig(ledger.flags_of(best), best.concurrency, result.reason), mem_ceiling
    ledger.record(LedgerEntry(epoch, dump, key, concurrency, "measured", measured, None,
                              result.reason if result else "", now))
    if result is None or not result.triggered or result.diagnosis is None:
        return None, mem_ceiling
    if model is None or gpu is None or version is None:
        return None, mem_ceiling
    proposal = propose(result.diagnosis, flags, concurrency, model, gpu, version,
                       ledger.tried(), mem_ceiling, avg_context, min_gain, allow_lossy)
    if proposal is None:
        return None, mem_ceiling
    return NextConfig(proposal.flags, proposal.concurrency,
                      f"{result.reason} → {proposal.reason}"), mem_ceiling


@task(name="restart_on_regression", cache_policy=NO_CACHE)
def restart_on_regression(result: WatchResult | None, failure: str | None, epoch: int,
                          flags: ServerFlags, concurrency: int | None, ledger_path: str,
                          model: ModelProfile | None, gpu: GpuProfile | None,
                          version: SGLangVersion | None, mem_ceiling: float, min_gain: float,
                          avg_context: float, allow_lossy: bool = False,
                          ) -> tuple[NextConfig | None, float]:
    return decide_next(result, failure, epoch, flags, concurrency, TuningLedger(Path(
        ledger_path)), model, gpu, version, mem_ceiling, min_gain, avg_context, allow_lossy)
