"""After an epoch: the configuration of the next one (the proposal, a rollback, or a retry
after a start that failed), as a Prefect task so each decision is visible in the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from infra.sglang.flags import ServerFlags
from infra.sglang.hardware import Hardware
from tasks.tuning.ledger import LedgerEntry, LedgerOutcome, TuningLedger, config_key
from tasks.tuning.policy import Search, propose
from tasks.tuning.watch import WatchResult


@dataclass(frozen=True)
class EpochReport:
    """What one epoch ran and how it ended, as the decision after it needs it."""

    epoch: int
    flags: ServerFlags
    concurrency: int | None
    result: WatchResult | None  # None: the fleet did not start
    failure: str | None = None  # why it did not start
    predicted_tok_s_per_gpu: float | None = None  # the model's figure when it was chosen


@dataclass(frozen=True)
class NextConfig:
    flags: ServerFlags
    concurrency: int | None
    reason: str
    predicted_tok_s_per_gpu: float | None = None  # what the model promised for it


def _resolved_mem_fraction(flags: ServerFlags, hw: Hardware | None) -> float | None:
    if flags.mem_fraction_static is not None:
        return flags.mem_fraction_static
    plan = hw.memory_plan_or_none(flags) if hw is not None else None
    return plan.mem_fraction_static if plan is not None else None


def _after_failed_start(report: EpochReport, ledger: TuningLedger, hw: Hardware | None,
                        mem_ceiling: float) -> tuple[NextConfig | None, float]:
    """Back to the best configuration so far; after an OOM the mem_fraction ceiling goes
    halfway down to the largest fraction known to work (a bisection step)."""
    failure = report.failure or ""
    failed_m = _resolved_mem_fraction(report.flags, hw)
    if "out of memory" in failure.lower() and failed_m is not None:
        good = [m for m in (_resolved_mem_fraction(ledger.flags_of(e), hw)
                            for e in ledger.entries() if e.outcome == "measured")
                if m is not None and m < failed_m]
        floor = max(good) if good else failed_m - 0.1
        mem_ceiling = min(mem_ceiling, round((floor + failed_m) / 2, 3))
    best = ledger.best()
    if best is None:
        return None, mem_ceiling
    return NextConfig(ledger.flags_of(best), best.concurrency,
                      f"start failed ({failure.splitlines()[0][:160] if failure else ''}); "
                      f"back to the best config so far ({best.tok_s_per_gpu:,.0f} tok/s per "
                      f"GPU); mem_fraction_static ceiling now {mem_ceiling}",
                      best.tok_s_per_gpu), mem_ceiling


def decide_next(report: EpochReport, ledger: TuningLedger, search: Search | None,
                mem_ceiling: float) -> tuple[NextConfig | None, float]:
    """Record what this epoch did — with what was predicted for it when it was chosen —
    and choose the next configuration (None: keep going as is). `search` is None where
    the hardware is unknown: no move is scored then.

    Returns (next config or None, the possibly lowered mem_fraction ceiling)."""
    key = config_key(report.flags, report.concurrency)

    def entry(outcome: LedgerOutcome, measured: float | None, note: str) -> LedgerEntry:
        return LedgerEntry(report.epoch, report.flags.model_dump(mode="json"), key,
                           report.concurrency, outcome, measured,
                           report.predicted_tok_s_per_gpu, note[:500], time.time())

    if report.failure is not None:
        ledger.record(entry("failed", None, report.failure))
        return _after_failed_start(report, ledger, search.hardware if search else None,
                                   mem_ceiling)
    result = report.result
    measured = result.measured_tok_s_per_gpu if result else None
    if result is not None and result.triggered and result.reason.startswith("rollback"):
        ledger.record(entry("rolled_back", measured, result.reason))
        best = ledger.best(other_than=key)
        if best is None:
            return None, mem_ceiling
        return NextConfig(ledger.flags_of(best), best.concurrency, result.reason,
                          best.tok_s_per_gpu), mem_ceiling
    ledger.record(entry("measured", measured, result.reason if result else ""))
    if result is None or not result.triggered or result.diagnosis is None or search is None:
        return None, mem_ceiling
    proposal = propose(result.diagnosis, report.flags, report.concurrency,
                       replace(search, tried=frozenset(ledger.tried()), mem_ceiling=mem_ceiling))
    if proposal is None:
        return None, mem_ceiling
    return NextConfig(proposal.flags, proposal.concurrency,
                      f"{result.reason} → {proposal.reason}",
                      proposal.predicted_tok_s_per_gpu), mem_ceiling


@task(name="restart_on_regression", cache_policy=NO_CACHE)
def restart_on_regression(report: EpochReport, ledger_path: str, search: Search | None,
                          mem_ceiling: float) -> tuple[NextConfig | None, float]:
    return decide_next(report, TuningLedger(Path(ledger_path)), search, mem_ceiling)
