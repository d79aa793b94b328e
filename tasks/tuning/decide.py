"""After an epoch: the configuration of the next one (the proposal, a rollback, or a retry
after a start that failed), as a Prefect task so each decision is visible in the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from infra.sglang.flags import ServerFlags
from infra.sglang.memory import PoolsDoNotFit, plan_memory
from infra.sglang.planner import Demand
from infra.sglang.profiles import GpuProfile, ModelProfile
from infra.sglang.versions import SGLangVersion
from tasks.tuning.ledger import LedgerEntry, TuningLedger, config_key
from tasks.tuning.policy import PrefixReuse, propose
from tasks.tuning.watch import WatchResult


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
    predicted_tok_s_per_gpu: float | None = None  # what the model promised for it


def decide_next(result: WatchResult | None, failure: str | None, epoch: int,
                flags: ServerFlags, concurrency: int | None, ledger: TuningLedger,
                model: ModelProfile | None, gpu: GpuProfile | None,
                version: SGLangVersion | None, mem_ceiling: float, min_gain: float,
                demand: Demand, allow_lossy: bool = False,
                predicted: float | None = None,
                reuse: PrefixReuse | None = None) -> tuple[NextConfig | None, float]:
    """Record what this epoch did — with what was predicted for it when it was chosen —
    and choose the next configuration (None: keep going as is).

    Returns (next config or None, the possibly lowered mem_fraction ceiling)."""
    key = config_key(flags, concurrency)
    now = time.time()
    dump = flags.model_dump(mode="json")
    if failure is not None:
        ledger.record(LedgerEntry(epoch, dump, key, concurrency, "failed", None, predicted,
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
                          f"mem_fraction_static ceiling now {mem_ceiling}",
                          best.tok_s_per_gpu), mem_ceiling
    measured = result.measured_tok_s_per_gpu if result else None
    if result is not None and result.triggered and result.reason.startswith("rollback"):
        ledger.record(LedgerEntry(epoch, dump, key, concurrency, "rolled_back", measured,
                                  predicted, result.reason, now))
        best = ledger.best(other_than=key)
        if best is None:
            return None, mem_ceiling
        return NextConfig(ledger.flags_of(best), best.concurrency, result.reason,
                          best.tok_s_per_gpu), mem_ceiling
    ledger.record(LedgerEntry(epoch, dump, key, concurrency, "measured", measured, predicted,
                              result.reason if result else "", now))
    if result is None or not result.triggered or result.diagnosis is None:
        return None, mem_ceiling
    if model is None or gpu is None or version is None:
        return None, mem_ceiling
    proposal = propose(result.diagnosis, flags, concurrency, model, gpu, version,
                       ledger.tried(), mem_ceiling, demand, min_gain, allow_lossy,
                       reuse=reuse)
    if proposal is None:
        return None, mem_ceiling
    return NextConfig(proposal.flags, proposal.concurrency,
                      f"{result.reason} → {proposal.reason}",
                      proposal.predicted_tok_s_per_gpu), mem_ceiling


@task(name="restart_on_regression", cache_policy=NO_CACHE)
def restart_on_regression(result: WatchResult | None, failure: str | None, epoch: int,
                          flags: ServerFlags, concurrency: int | None, ledger_path: str,
                          model: ModelProfile | None, gpu: GpuProfile | None,
                          version: SGLangVersion | None, mem_ceiling: float, min_gain: float,
                          demand: Demand, allow_lossy: bool = False,
                          predicted: float | None = None,
                          reuse: PrefixReuse | None = None) -> tuple[NextConfig | None, float]:
    return decide_next(result, failure, epoch, flags, concurrency, TuningLedger(Path(
        ledger_path)), model, gpu, version, mem_ceiling, min_gain, demand, allow_lossy,
        predicted, reuse)
