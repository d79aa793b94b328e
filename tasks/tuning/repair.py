"""Servers put right alone, on the same configuration, while the rest keep generating: a slow
server of an asymmetric fleet, and a server whose process died.

Many causes of one server running well below the others clear with a restart of that server:
pools sized while another process held part of its GPU's memory (seen on the H200: a server
started beside two others got no room for its KV cache), a CUDA context in a bad state,
clocks stuck low after an error. Restarting it alone costs one server's start-up while the
rest keep generating; the fleet is never stopped for it. Each server gets one such restart
per job: one that is still slow after it is the GPU itself, which the log says and leaves to
the user (nvidia-smi), rather than restarting it again and again.

A server whose process is gone (a crash, an OOM kill, a GPU error, a row that kills SGLang's
scheduler) is started again, up to MAX_RELAUNCHES times per job: otherwise a 40-hour job
runs its remaining hours one server short, and with tuning on the watch stops the whole
fleet for it. A row that kills every server it reaches fails its attempts
(`client.max_attempts`) and is written as an error row, while the fleet comes back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.fleet_control import DispatchEnded
from tasks.health import ServerStartFailed, StartAborted, log_tail
from tasks.rolling import RollingFleet
from tasks.tuning.cycles import Cycle
from tasks.tuning.diagnosis import Diagnosis, slow_servers
from tasks.tuning.state import TunerState
from tasks.tuning.watch import RegressionWatch


def asymmetry_handler(state: TunerState, fleet: RollingFleet, epoch: int,
                      watch: RegressionWatch) -> Callable[[Diagnosis], bool]:
    """The watch's `on_asymmetric`: restart each slow server alone (once), record it."""

    told: set[str] = set()

    def handle(diag: Diagnosis) -> bool:
        settled = 2 * state.job.tuning.window_s
        if time.monotonic() - fleet.last_join < settled:
            return False  # a server (re)joined recently: the fleet is not in steady state
        slow = slow_servers(diag)
        todo = [s for s in slow if s[0] not in state.restarted_alone]
        for name in {s[0] for s in slow} - {s[0] for s in todo} - told:
            told.add(name)
            state.logger.warning("%s is still slow after a restart of its own: the GPU "
                                 "itself (check nvidia-smi and that server's log); left as "
                                 "it is", name)
        for name, tok_s, median in todo:
            state.restarted_alone_once(name)
            restart_alone(SlowServer(name, tok_s, median), state, fleet, epoch)
        if not todo:
            return False
        caps = state.capacities_changed(epoch, fleet.capacities())
        watch.reconfigured(caps, state.memory_plan(), watch.baseline, watch.concurrency)
        return True

    return handle


@dataclass(frozen=True)
class SlowServer:
    """A server of an asymmetric fleet: its rate and the fleet's median (tok/s per GPU)."""

    name: str
    tok_s: float
    median: float

    @property
    def index(self) -> int:
        return int(self.name.rsplit("-", 1)[1])


@task(name="restart_slow_server", task_run_name="restart {slow.name}", cache_policy=NO_CACHE)
def restart_alone(slow: SlowServer, state: TunerState, fleet: RollingFleet,
                  epoch: int) -> None:
    """A task run of the flow's (called from the watch's thread, in the run's context)."""
    config = state.config
    why = (f"{slow.name} ran {slow.tok_s:,.0f} tok/s per GPU against a median of "
           f"{slow.median:,.0f}: restarted alone on the same config")
    state.logger.warning("asymmetric fleet: %s", why)
    try:
        replaced = fleet.replace(slow.index, config, tag="restart", force=True)
    except ServerStartFailed as exc:
        state.logger.error("%s did not come back (%s); the others go on without it",
                           slow.name, str(exc).splitlines()[0][:200])
        return
    state.record_cycle(Cycle(
        epoch=epoch, measured_tok_s_per_gpu=round(slow.tok_s, 1), diagnosis="asymmetric",
        reason=f"{why}; healthy after {replaced.startup_s:.0f} s, cap "
               f"{replaced.capacity.max_running_requests}",
        old=config.key, new_flags=config.flags.model_dump(exclude_none=True,
                                                          exclude={"extra_args"}),
        new_concurrency=config.concurrency, cycle_seconds=round(replaced.out_s, 2),
        kind="restart-one"))


MAX_RELAUNCHES = 2  # per server per job: one that keeps dying is left down, and said so


def relaunch_handler(state: TunerState, fleet: RollingFleet, epoch: int,
                     watch: RegressionWatch) -> Callable[[], bool]:
    """The watch's `on_dead`: start each server whose process is gone again, alone. While
    one is being relaunched or has relaunches left, the dispatcher waits for it rather than
    end the run when every server is down at once (fleet.control.revival)."""

    told: set[str] = set()
    relaunching = threading.Event()

    def may_revive() -> bool:
        return watch.watching and (relaunching.is_set() or any(
            state.relaunched.get(f"server-{i}", 0) < MAX_RELAUNCHES for i in fleet.dead()))

    def handle() -> bool:
        relaunched = False
        for index in fleet.dead():
            name = f"server-{index}"
            if state.relaunched.get(name, 0) >= MAX_RELAUNCHES:
                if name not in told:
                    told.add(name)
                    state.logger.error("%s died again after %d relaunches; left down, the "
                                       "others go on (its log: %s)", name, MAX_RELAUNCHES,
                                       fleet.handle(index).log_path)
                continue
            state.relaunch_counted(name)
            relaunching.set()
            try:
                relaunched |= relaunch(index, state, fleet, epoch)
            finally:
                relaunching.clear()
        if relaunched:
            caps = state.capacities_changed(epoch, fleet.capacities())
            watch.reconfigured(caps, state.memory_plan(), watch.baseline, watch.concurrency)
        return relaunched

    fleet.control.revival = may_revive
    return handle


@task(name="relaunch_server", task_run_name="relaunch server-{index}", cache_policy=NO_CACHE)
def relaunch(index: int, state: TunerState, fleet: RollingFleet, epoch: int) -> bool:
    """Start dead server `index` again with the fleet's config; True when it came back (a
    task run of the flow's, called from the watch's thread)."""
    config = state.config
    handle = fleet.handle(index)
    why = f"server-{index}'s process is gone ({last_line(handle.log_path)})"
    state.logger.warning("%s: relaunched alone on the same config", why)
    try:
        replaced = fleet.replace(index, config, tag="relaunch", force=True)
    except (StartAborted, DispatchEnded):
        return False  # the epoch is ending (its stop finds the relaunched process)
    except ServerStartFailed as exc:
        state.logger.error("server-%d did not come back (%s); the others go on without it",
                           index, str(exc).splitlines()[0][:200])
        return False
    state.record_cycle(Cycle(
        epoch=epoch, measured_tok_s_per_gpu=None, diagnosis="unhealthy",
        reason=f"{why}; healthy again after {replaced.startup_s:.0f} s, cap "
               f"{replaced.capacity.max_running_requests}, {replaced.failed_over} request(s) "
               "redone elsewhere",
        old=config.key, new_flags=config.flags.model_dump(exclude_none=True,
                                                          exclude={"extra_args"}),
        new_concurrency=config.concurrency, cycle_seconds=round(replaced.out_s, 2),
        kind="relaunch"))
    return True


def last_line(log: str) -> str:
    """The server log's last line: SGLang's, or the simulator's, reason for exiting."""
    line = log_tail(log, 1).strip()
    return f"its log ends: {line[:200]!r}" if line else "its log is empty or gone"
