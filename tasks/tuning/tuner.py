"""The tuner: the one owner of everything a run changes about its fleet's configuration.

It holds the live configuration, the hardware it reasons about, the tuning ledger and the
record of cycles (tasks/tuning/state.py), and offers the flow the few calls a job needs:
`fleet_up` and `fleet_measured` when an epoch's servers are up, `watch` to watch them while
they generate (and carry out a canary, a rollout or rollback, a repair or, for servers it
does not own, advice — tasks/tuning/rollout.py, repair.py, advice.py), and `after_epoch`
to choose the next epoch's configuration. The flows read like the job; nothing else writes
the tuner's state.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infra.settings import JobSettings
from infra.sglang.memory import MemoryPlan
from tasks.capacity import Capacity
from tasks.engines import Engine
from tasks.fleet_config import FleetConfig
from tasks.health import ServerStartFailed
from tasks.monitor import FleetMonitor
from tasks.rolling import RollingFleet
from tasks.totals import RunTotals
from tasks.tuning.advice import advice_handler
from tasks.tuning.cycles import Cycle
from tasks.tuning.decide import EpochReport, NextConfig, restart_on_regression
from tasks.tuning.diagnosis import Diagnosis, generated_per_finished
from tasks.tuning.ledger import LedgerEntry, TuningLedger, config_key
from tasks.tuning.policy import (
    Proposal,
    Search,
    gain_to_pay_for_restart,
    pools_pinned,
    propose,
    restart_cost,
)
from tasks.tuning.repair import asymmetry_handler, relaunch_handler
from tasks.tuning.rollout import canary_handler
from tasks.tuning.state import TunerState
from tasks.tuning.watch import CheckLog, RegressionWatch, WatchResult, WatchTargets


@dataclass(frozen=True)
class WorkLeft:
    """The work an epoch starts with: shards pending and the prompts in them."""

    shards: int
    prompts: int


@dataclass
class Pace:
    """How long the work left takes at a diagnosed rate, and so what a restart must promise
    to pay for itself (tasks/tuning/policy.py: restart_cost, gain_to_pay_for_restart)."""

    state: TunerState
    capacities: list[Capacity]
    startup_s: float
    prompts_at_start: int
    done_at_start: int

    def rates(self, diag: Diagnosis) -> tuple[float, float, int]:
        """(output tokens per prompt, one server's wall tok/s, prompts left) at `diag`."""
        totals, job = self.state.totals, self.state.job
        per_prompt = (totals.tokens / totals.done if totals.done
                      else 0.75 * job.sampling.max_new_tokens)
        left = max(0, self.prompts_at_start - (totals.done - self.done_at_start))
        return per_prompt, diag.tok_s_per_gpu * self.state.time_scale, left

    def gain_needed(self, diag: Diagnosis) -> float:
        job = self.state.job
        tuning = job.tuning
        per_prompt, server_tok_s, left = self.rates(diag)
        if server_tok_s <= 0:
            return tuning.min_predicted_gain
        cost = restart_cost(self.startup_s, tuning.drain_timeout_s, job.stop_grace_s,
                            per_prompt, max(c.max_running_requests for c in self.capacities),
                            server_tok_s)
        return gain_to_pay_for_restart(left, per_prompt, server_tok_s, len(self.capacities), cost,
                                       tuning.min_predicted_gain, tuning.restart_payback)

    def work_left_s(self, diag: Diagnosis) -> float:
        """Wall seconds the fleet needs for the work left at the diagnosed rate."""
        per_prompt, server_tok_s, left = self.rates(diag)
        if server_tok_s <= 0:
            return 0.0
        return left * per_prompt / (server_tok_s * len(self.capacities))


class Tuner:
    """One run's tuner: created once per flow run, asked at every epoch (module docstring)."""

    def __init__(self, settings: JobSettings, engine: Engine, ledger: TuningLedger,
                 monitor: FleetMonitor, totals: RunTotals, logger: Any) -> None:
        self.resumed = (ledger.resume_point(settings.server, settings.client.concurrency_per_server)
                        if settings.tuning.enabled else None)
        self.first_epoch = ledger.last_epoch() + 1
        config = (FleetConfig.of(settings) if self.resumed is None
                  else _resume_on(ledger, self.resumed, logger))
        self.state = TunerState(settings, config, ledger, monitor, totals, logger, engine,
                                engine.hardware(None))
        self.state.resumed(ledger.moves(), self.resumed.predicted_tok_s_per_gpu
                           if self.resumed is not None else None)

    @property
    def engine(self) -> Engine:
        """The run's engine, built once."""
        return self.state.engine

    @property
    def settings(self) -> JobSettings:
        """The job's settings on the configuration the fleet runs now: what an epoch
        launches and dispatches with."""
        return self.state.settings

    # --- what the run's summary and report read ------------------------------------------

    @property
    def cycles(self) -> list[Cycle]:
        return self.state.cycles

    @property
    def capacities(self) -> list[Capacity]:
        """The servers' own figures, as the fleet stands now."""
        return self.state.capacities

    @property
    def caps_by_epoch(self) -> dict[int, dict[str, int]]:
        return self.state.caps_by_epoch

    @property
    def advice(self) -> list[dict[str, Any]]:
        """The moves written down for servers it may not restart (engine=external)."""
        return self.state.advice

    @property
    def time_scale(self) -> float:
        return self.state.time_scale

    def memory_plan(self) -> MemoryPlan | None:
        """The memory model's view of the running flags (None where it has none)."""
        return self.state.memory_plan()

    # --- an epoch's fleet ---------------------------------------------------------------

    def fleet_up(self, startup_s: float) -> None:
        """The epoch's servers answer: the last restart cycle ends here."""
        if self.state.cycles:
            self.state.cycles[-1].next_fleet_up(startup_s)

    def fleet_measured(self, epoch: int, capacities: list[Capacity]) -> MemoryPlan | None:
        """The servers' own capacities (and the SGLang version they report) are known: the
        hardware the policy reasons about, and the memory model's view of the flags."""
        self.state.hardware_known(self.state.engine.hardware(capacities[0].version))
        self.state.capacities_changed(epoch, capacities)
        return self.state.memory_plan()

    def watch(self, epoch: int, fleet: RollingFleet, work: WorkLeft,
              startup_s: float) -> RegressionWatch:
        """The epoch's regression watch, with what it may do: canary, rollout and rollback,
        repairs of single servers — or, for servers the job does not own, advice."""
        state, tuning = self.state, self.state.job.tuning
        capacities = state.capacities
        pace = Pace(state, capacities, startup_s, work.prompts, state.totals.done)
        best = state.ledger.best(state.config.key)
        watch = RegressionWatch(
            state.monitor,
            WatchTargets({f"server-{c.index}": c.max_running_requests for c in capacities},
                         state.memory_plan(), state.time_scale, tuning.window_s,
                         tuning.target_tok_s_per_gpu, best.tok_s_per_gpu if best else None,
                         state.config.concurrency),
            self._may_move(work, len(capacities)), self._proposer(), pace.gain_needed)
        watch.work_left_s = pace.work_left_s
        # one line per changed verdict, else one per ten windows of wall clock
        watch.on_check = CheckLog(state.logger.info, 10 * tuning.window_s)
        if state.engine.owns_servers:
            watch.on_proposal = canary_handler(state, fleet, epoch, watch)
            watch.on_asymmetric = asymmetry_handler(state, fleet, epoch, watch)
            watch.on_dead = relaunch_handler(state, fleet, epoch, watch)
        else:  # someone else's servers: advice instead of restarts, never a fleet restart
            watch.on_proposal = advice_handler(state, watch)
            watch.advise_only = True
        return watch

    def _shared_gpus(self) -> bool:
        return self.state.job.servers_per_gpu > 1

    def _may_move(self, work: WorkLeft, servers: int) -> bool:
        """Tuning on, restarts left, work for more than two rounds, hardware known — and
        with several servers per GPU, pools pinned (the memory model plans whole GPUs)."""
        tuning, hw = self.state.job.tuning, self.state.hardware
        return (tuning.enabled and self.state.restarts < tuning.max_restarts
                and work.shards > 2 * servers and hw is not None
                and (not self._shared_gpus()
                     or pools_pinned(self.state.config.flags, hw.model.hybrid)))

    def search(self, min_gain: float) -> Search | None:
        """What a move is scored against now: the job's own workload, the moves tried, the
        mem_fraction ceiling, the prefix reuse a move may lose."""
        state, job = self.state, self.state.job
        if state.hardware is None:
            return None
        tuning = job.tuning
        demand = state.totals.demand(tuning.avg_context,
                                     generated_per_finished(state.monitor.snapshot()),
                                     job.sampling.max_new_tokens)
        tried = state.ledger.tried() | {state.config.key}
        return Search(state.hardware, frozenset(tried), demand, state.mem_ceiling, min_gain,
                      tuning.allow_lossy, self._shared_gpus(), state.totals.prefix_reuse())

    def _proposer(self) -> Callable[[Diagnosis, float], Proposal | None]:
        def can_propose(diag: Diagnosis, min_gain: float) -> Proposal | None:
            search = self.search(min_gain)
            if search is None:
                return None
            if search.demand.workload is None and diag.kind != "client-bound":
                return None  # no move scored on the decode rate alone: wait for a commit
            config = self.state.config
            return propose(diag, config.flags, config.concurrency, search)

        return can_propose

    # --- between epochs -----------------------------------------------------------------

    def after_epoch(self, epoch: int, result: WatchResult | None,
                    start_failure: ServerStartFailed | None, more_work: bool) -> None:
        """Record the epoch and choose the next one's configuration; raises when a start
        failed with nothing known to work to go back to."""
        state = self.state
        failure = str(start_failure) if start_failure is not None else None
        min_gain = (result.required_gain if result and result.required_gain is not None
                    else state.job.tuning.min_predicted_gain)
        report = EpochReport(epoch, state.config.flags, state.config.concurrency,
                             result, failure, state.predicted_tok_s_per_gpu)
        decision, ceiling = restart_on_regression(
            report, str(state.ledger.path), self.search(min_gain), state.mem_ceiling)
        state.mem_ceiling_lowered(ceiling)
        if start_failure is not None and decision is None:
            raise ServerStartFailed(f"servers failed to start and no earlier config worked: "
                                    f"{failure}", start_failure.handle, "")
        if decision is not None and more_work:
            self._restart_with(decision, report)

    def _restart_with(self, decision: NextConfig, report: EpochReport) -> None:
        """Record the cycle; the next epoch starts with the new configuration."""
        state, result = self.state, report.result
        restarts = state.restart_counted()
        state.predicts(decision.predicted_tok_s_per_gpu)
        state.record_cycle(Cycle(
            epoch=report.epoch,
            measured_tok_s_per_gpu=result.measured_tok_s_per_gpu if result else None,
            diagnosis=(result.diagnosis.kind if result and result.diagnosis
                       else "start failed"),
            reason=decision.reason, old=config_key(report.flags, report.concurrency),
            new_flags=decision.flags.model_dump(exclude_none=True, exclude={"extra_args"}),
            new_concurrency=decision.concurrency,
            predicted_tok_s_per_gpu=decision.predicted_tok_s_per_gpu,
            triggered_at=result.triggered_at if result else None))
        state.logger.warning("restart %d: %s", restarts, decision.reason)
        state.ledger.record(LedgerEntry(
            report.epoch + 1, decision.flags.model_dump(mode="json"),
            config_key(decision.flags, decision.concurrency), decision.concurrency, "started",
            None, decision.predicted_tok_s_per_gpu, decision.reason[:500], time.time()))
        state.now_runs(FleetConfig(decision.flags, decision.concurrency),
                       decision.predicted_tok_s_per_gpu)


def _resume_on(ledger: TuningLedger, entry: LedgerEntry, logger: Any) -> FleetConfig:
    """The configuration an interrupted run of this job had moved to."""
    figure = (f"measured {entry.tok_s_per_gpu:,.0f}" if entry.tok_s_per_gpu
              else f"predicted {entry.predicted_tok_s_per_gpu or 0:,.0f}")
    logger.info("resuming on the configuration this job moved to in epoch %d (%s tok/s per GPU;"
                " tuning.jsonl): %s, concurrency %s — not the flags given, which it started from",
                entry.epoch, figure, ledger.flags_of(entry).fingerprint(), entry.concurrency)
    return FleetConfig(ledger.flags_of(entry), entry.concurrency)
