"""What the tuner knows and has changed over a run, in one record with one owner
(tasks/tuning/tuner.py): the configuration the fleet runs now, the hardware it reasons about,
the tuning ledger, every cycle, the measured capacities, the advice written for servers it
may not restart. Its fields change through its own methods only, each one a thing that
happened (a restart, a rollout, a relaunch): the tuner and the handlers it gives the watch
(rollout, repair, advice) call them, from the flow's thread or the watch's, and the flow
reads the record for the summary (tests/unit/test_tuner_state_writes.py holds this).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infra.settings import JobSettings
from infra.sglang.hardware import Hardware
from infra.sglang.memory import MemoryPlan
from infra.sglang.planner import MAX_MEM_FRACTION
from tasks.capacity import Capacity
from tasks.engines import Engine
from tasks.fleet_config import FleetConfig
from tasks.monitor import FleetMonitor
from tasks.totals import RunTotals
from tasks.tuning.cycles import Cycle, cycles_artifact
from tasks.tuning.ledger import TuningLedger


@dataclass
class TunerState:
    job: JobSettings  # the job's facts; its `server` and `client` are where it started
    config: FleetConfig  # what the fleet runs now (a rollout or a restart changes it)
    ledger: TuningLedger
    monitor: FleetMonitor
    totals: RunTotals  # what the commits say about the workload
    logger: Any
    engine: Engine  # the run's, built once: launches, measures and speaks to the servers
    hardware: Hardware | None = None  # None: model, GPU or version unknown — no moves
    mem_ceiling: float = MAX_MEM_FRACTION  # lowered after an out-of-memory start
    restarts: int = 0
    predicted_tok_s_per_gpu: float | None = None  # the model's figure for the running config
    restarted_alone: set[str] = field(default_factory=set)  # slow servers restarted once
    relaunched: dict[str, int] = field(default_factory=dict)  # dead servers started again
    cycles: list[Cycle] = field(default_factory=list)
    capacities: list[Capacity] = field(default_factory=list)  # the servers' own figures now
    caps_by_epoch: dict[int, dict[str, int]] = field(default_factory=dict)  # for the report
    advice: list[dict[str, Any]] = field(default_factory=list)  # engine=external

    def resumed(self, restarts: int, predicted_tok_s_per_gpu: float | None) -> None:
        """A resumed run: the moves its ledger holds, the figure its last config had."""
        self.restarts = restarts
        self.predicted_tok_s_per_gpu = predicted_tok_s_per_gpu

    def hardware_known(self, hardware: Hardware | None) -> None:
        """The servers reported their version: the hardware the policy reasons about."""
        self.hardware = hardware

    def restart_counted(self) -> int:
        """A restart (a canary cycle or a whole-fleet one) spent; the count so far."""
        self.restarts += 1
        return self.restarts

    def now_runs(self, config: FleetConfig, predicted_tok_s_per_gpu: float | None) -> None:
        """The fleet runs `config` (a rollout, or the next epoch's restart)."""
        self.config = config
        self.predicted_tok_s_per_gpu = predicted_tok_s_per_gpu

    def predicts(self, predicted_tok_s_per_gpu: float | None) -> None:
        self.predicted_tok_s_per_gpu = predicted_tok_s_per_gpu

    def mem_ceiling_lowered(self, ceiling: float) -> None:
        """The highest mem fraction a config may ask for (lower after an out-of-memory
        start; unchanged otherwise)."""
        self.mem_ceiling = ceiling

    def restarted_alone_once(self, server: str) -> None:
        """A slow server restarted on its own (never twice: then it is the GPU)."""
        self.restarted_alone.add(server)

    def relaunch_counted(self, server: str) -> int:
        """A dead server started again; its relaunches so far."""
        self.relaunched[server] = self.relaunched.get(server, 0) + 1
        return self.relaunched[server]

    def advised(self, record: dict[str, Any]) -> None:
        """A move written down for servers the job may not restart (engine=external)."""
        self.advice.append(record)

    @property
    def time_scale(self) -> float:
        """Modeled GPU seconds per wall second (1 on a real GPU)."""
        return self.engine.time_scale()

    def record_cycle(self, cycle: Cycle) -> None:
        """Keep it, and rewrite the tuning-ledger artifact with it."""
        self.cycles.append(cycle)
        cycles_artifact(self.cycles)

    def capacities_changed(self, epoch: int, capacities: list[Capacity]) -> dict[str, int]:
        """The fleet's caps after a start, rollout, restart or relaunch (by server name)."""
        self.capacities = capacities
        caps = {f"server-{c.index}": c.max_running_requests for c in capacities}
        self.caps_by_epoch[epoch] = caps
        return caps

    @property
    def settings(self) -> JobSettings:
        """The job's settings on the running configuration: what an epoch launches."""
        return self.config.applied_to(self.job)

    def memory_plan(self, config: FleetConfig | None = None) -> MemoryPlan | None:
        """The memory model's view of this (else the running) configuration's flags; None
        without one."""
        if self.hardware is None:
            return None
        return self.hardware.memory_plan_or_none((config or self.config).flags)
