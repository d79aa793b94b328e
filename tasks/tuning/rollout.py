"""A canary cycle inside an epoch, and what it changes: the live configuration, the tuning
ledger, the run's record of cycles and the watch's idea of the current config.

The cycle itself (restart k servers, compare, roll out or back) is tasks/tuning/canary.py;
this is what a run records and changes around it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.fleet_config import FleetConfig
from tasks.rolling import RollingFleet
from tasks.tuning.canary import CanaryCycle, CanaryRun
from tasks.tuning.cycles import Cycle
from tasks.tuning.diagnosis import Diagnosis
from tasks.tuning.ledger import LedgerEntry, LedgerOutcome
from tasks.tuning.policy import Proposal
from tasks.tuning.state import TunerState
from tasks.tuning.watch import RegressionWatch


def canary_possible(canary_servers: int, servers: int) -> bool:
    """A canary needs servers that keep the current config while it is tried."""
    return 1 <= canary_servers < servers


@dataclass(frozen=True)
class Move:
    """One tried move: what ran, what was tried instead, why, and in which epoch."""

    current: FleetConfig
    candidate: FleetConfig
    diagnosis: Diagnosis
    proposal: Proposal
    epoch: int


def canary_handler(state: TunerState, fleet: RollingFleet, epoch: int,
                   watch: RegressionWatch) -> Callable[[Diagnosis, Proposal], bool]:
    """The watch's `on_proposal`: run the cycle, record it, and tell the watch what runs."""

    def handle(diag: Diagnosis, proposal: Proposal) -> bool:
        tuning = state.job.tuning
        if not canary_possible(tuning.canary_servers, len(fleet.config_of)):
            return False  # a whole-fleet restart, as before
        move = Move(state.config, proposal.config, diag, proposal, epoch)
        state.logger.warning("canary: %s on %d of %d servers — %s",
                             move.candidate.flags.fingerprint(),
                             tuning.canary_servers, len(fleet.config_of), proposal.reason)
        cycle = canary(CanaryRun(fleet, state.monitor, state.time_scale, state.logger,
                                 fleet.abort, rollout_pays(watch, diag, tuning.restart_payback)),
                       move)
        state.restart_counted()
        record_cycle(cycle, move, state)
        if cycle.outcome == "rolled_out":
            _rolled_out(move, state, fleet, watch)
        if state.restarts >= tuning.max_restarts or cycle.outcome == "canary_only":
            watch.enabled = False  # (canary_only: the job is near its end, and the fleet mixed)
        return True

    return handle


@task(name="canary", task_run_name="canary epoch {move.epoch}: {move.diagnosis.kind}",
      cache_policy=NO_CACHE)
def canary(run: CanaryRun, move: Move) -> CanaryCycle:
    """The cycle as a task run of the flow's (the watch's thread carries the run's context):
    restart the canary servers onto the candidate, compare, roll out or back."""
    return run.run(move.current, move.candidate, move.proposal.predicted_gain)


def _rolled_out(move: Move, state: TunerState, fleet: RollingFleet,
                watch: RegressionWatch) -> None:
    """The fleet now runs the candidate: judged afresh, and a rollback compares with the
    best *other* config (the canary's own figure read a wave of first completions: 1,829
    against a steady 1,545)."""
    state.now_runs(move.candidate, move.proposal.predicted_tok_s_per_gpu)
    caps = state.capacities_changed(move.epoch, fleet.capacities())
    other = state.ledger.best(move.candidate.key)
    watch.reconfigured(caps, state.memory_plan(move.candidate),
                       other.tok_s_per_gpu if other else None, move.candidate.concurrency)


def rollout_pays(watch: RegressionWatch, diag: Diagnosis,
                 payback: float) -> Callable[[float, float], bool] | None:
    """Whether restarting the other servers onto a won canary's config pays back over the
    work left: each one is out for about as long as the canary was (`restart_s`, measured)
    and then runs `gain`× faster for the rest of the job, saving work_left × (1 − 1/gain);
    that must be `tuning.restart_payback` × what it costs. On a long job any win pays; CI
    saw a won canary roll out as the work ran out."""
    left = watch.work_left_s
    if left is None:
        return None
    return lambda gain, restart_s: left(diag) * (1 - 1 / gain) >= payback * restart_s


def record_cycle(cycle: CanaryCycle, move: Move, state: TunerState) -> None:
    """Ledger lines (current measured by the control group, the candidate by the canary),
    the run's cycle list, the tuning-ledger artifact and one log line with the verdict."""
    now = time.time()
    current, candidate = move.current, move.candidate
    diag, proposal = move.diagnosis, move.proposal
    state.ledger.record(LedgerEntry(
        move.epoch, current.flags.model_dump(mode="json"), current.key, current.concurrency,
        "measured", cycle.control_tok_s,
        state.predicted_tok_s_per_gpu,
        f"{diag.kind}: {diag.evidence} (the control group of a canary)"[:500], now))
    outcome: LedgerOutcome = ("measured" if cycle.outcome in ("rolled_out", "canary_only") else
                              "rolled_back" if cycle.outcome == "rolled_back" else "failed")
    state.ledger.record(LedgerEntry(
        move.epoch, candidate.flags.model_dump(mode="json"), candidate.key,
        candidate.concurrency, outcome, cycle.canary_tok_s,
        proposal.predicted_tok_s_per_gpu,
        f"canary {cycle.outcome}: {cycle.note or proposal.reason}"[:500], now))
    state.record_cycle(Cycle(
        epoch=move.epoch, measured_tok_s_per_gpu=cycle.control_tok_s, diagnosis=diag.kind,
        reason=f"canary {cycle.outcome} — {proposal.reason}",
        old=current.key,
        new_flags=candidate.flags.model_dump(exclude_none=True, exclude={"extra_args"}),
        new_concurrency=candidate.concurrency,
        predicted_tok_s_per_gpu=proposal.predicted_tok_s_per_gpu,
        cycle_seconds=round((cycle.ended_at or cycle.started_at) - cycle.started_at, 2),
        kind="canary", canary=cycle.record()))
    state.logger.warning(
        "canary %s: canary %s vs control %s tok/s per server (%s measured, %s predicted), %d "
        "server restarts, fleet never below %s of before", cycle.outcome,
        _num(cycle.canary_tok_s), _num(cycle.control_tok_s), _ratio(cycle.measured_gain),
        _ratio(cycle.predicted_gain), cycle.server_restarts, _ratio(cycle.min_fleet_fraction))


def _num(value: Any) -> str:
    return f"{value:,.0f}" if isinstance(value, (int, float)) else "-"


def _ratio(value: float | None) -> str:
    return f"{value:.2f}×" if value is not None else "-"
