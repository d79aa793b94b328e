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
scheduler) is started again, up to MAX_RELAUNCHES times per job; before this, a 40-hour job
ran its remaining hours one server short, and with tuning on the watch stopped the whole
fleet for it. A row that kills every server it reaches fails its attempts
(`client.max_attempts`) and is written as an error row, while the fleet comes back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from flows.job import Cycle, Hardware, cycles_artifact
from flows.rollout import LiveConfig
from tasks.health import ServerStartFailed, StartAborted, log_tail
from tasks.rolling import RollingFleet
from tasks.tuning.diagnosis import Diagnosis, slow_servers
from tasks.tuning.ledger import config_key

if TYPE_CHECKING:
    from flows.epoch import JobContext, TunerState
    from tasks.tuning.watch import RegressionWatch

def asymmetry_handler(live: LiveConfig, fleet: RollingFleet, ctx: JobContext,
                      tuner: TunerState, hw: Hardware, epoch: int,
                      watch: Callable[[], RegressionWatch]) -> Callable[[Diagnosis], bool]:
    """The watch's `on_asymmetric`: restart each slow server alone (once), record it."""

    told: set[str] = set()

    def handle(diag: Diagnosis) -> bool:
        settled = 2 * live.settings.tuning.window_s
        if time.monotonic() - fleet.last_join < settled:
            return False  # a server (re)joined recently: the fleet is not in steady state
        slow = slow_servers(diag)
        todo = [s for s in slow if s[0] not in tuner.restarted_alone]
        for name in {s[0] for s in slow} - {s[0] for s in todo} - told:
            told.add(name)
            ctx.logger.warning("%s is still slow after a restart of its own: the GPU itself "
                               "(check nvidia-smi and that server's log); left as it is", name)
        for name, tok_s, median in todo:
            tuner.restarted_alone.add(name)
            restart_alone(name, tok_s, median, live, fleet, ctx, epoch)
        if not todo:
            return False
        caps = {f"server-{c.index}": c.max_running_requests for c in fleet.capacities()}
        ctx.totals.capacities = fleet.capacities()
        w = watch()
        w.reconfigured(caps, hw.plan(live.settings), w.baseline)
        return True

    return handle


def restart_alone(name: str, tok_s: float, median: float, live: LiveConfig,
                  fleet: RollingFleet, ctx: JobContext, epoch: int) -> None:
    settings = live.settings
    index = int(name.rsplit("-", 1)[1])
    why = (f"{name} ran {tok_s:,.0f} tok/s per GPU against a median of {median:,.0f}: "
           "restarted alone on the same config")
    ctx.logger.warning("asymmetric fleet: %s", why)
    try:
        replaced = fleet.replace(index, settings, tag="restart", force=True)
    except ServerStartFailed as exc:
        ctx.logger.error("%s did not come back (%s); the others go on without it", name,
                         str(exc).splitlines()[0][:200])
        return
    concurrency = settings.client.concurrency_per_server
    ctx.totals.cycles.append(Cycle(
        epoch=epoch, measured_tok_s_per_gpu=round(tok_s, 1), diagnosis="asymmetric",
        reason=f"{why}; healthy after {replaced.startup_s:.0f} s, cap "
               f"{replaced.capacity.max_running_requests}",
        old=config_key(settings.server, concurrency),
        new_flags=settings.server.model_dump(exclude_none=True, exclude={"extra_args"}),
        new_concurrency=concurrency, cycle_seconds=round(replaced.out_s, 2),
        kind="restart-one"))
    cycles_artifact(ctx.totals.cycles)


MAX_RELAUNCHES = 2  # per server per job: one that keeps dying is left down, and said so


def relaunch_handler(live: LiveConfig, fleet: RollingFleet, ctx: JobContext,
                     tuner: TunerState, hw: Hardware, epoch: int,
                     watch: Callable[[], RegressionWatch]) -> Callable[[], bool]:
    """The watch's `on_dead`: start each server whose process is gone again, alone."""

    told: set[str] = set()

    def handle() -> bool:
        relaunched = False
        for index in fleet.dead():
            name = f"server-{index}"
            if tuner.relaunched.get(name, 0) >= MAX_RELAUNCHES:
                if name not in told:
                    told.add(name)
                    ctx.logger.error("%s died again after %d relaunches; left down, the "
                                     "others go on (its log: %s)", name, MAX_RELAUNCHES,
                                     fleet.handle(index).log_path)
                continue
            tuner.relaunched[name] = tuner.relaunched.get(name, 0) + 1
            relaunched |= relaunch(index, live, fleet, ctx, epoch)
        if relaunched:
            ctx.totals.capacities = fleet.capacities()
            w = watch()
            w.reconfigured({f"server-{c.index}": c.max_running_requests
                            for c in fleet.capacities()}, hw.plan(live.settings), w.baseline)
        return relaunched

    return handle


def relaunch(index: int, live: LiveConfig, fleet: RollingFleet, ctx: JobContext,
             epoch: int) -> bool:
    """Start dead server `index` again with the fleet's config; True when it came back."""
    settings = live.settings
    handle = fleet.handle(index)
    why = f"server-{index}'s process is gone ({last_line(handle.log_path)})"
    ctx.logger.warning("%s: relaunched alone on the same config", why)
    try:
        replaced = fleet.replace(index, settings, tag="relaunch", force=True)
    except StartAborted:
        return False  # the epoch is ending
    except ServerStartFailed as exc:
        ctx.logger.error("server-%d did not come back (%s); the others go on without it", index,
                         str(exc).splitlines()[0][:200])
        return False
    concurrency = settings.client.concurrency_per_server
    ctx.totals.cycles.append(Cycle(
        epoch=epoch, measured_tok_s_per_gpu=None, diagnosis="unhealthy",
        reason=f"{why}; healthy again after {replaced.startup_s:.0f} s, cap "
               f"{replaced.capacity.max_running_requests}, {replaced.failed_over} request(s) "
               "redone elsewhere",
        old=config_key(settings.server, concurrency),
        new_flags=settings.server.model_dump(exclude_none=True, exclude={"extra_args"}),
        new_concurrency=concurrency, cycle_seconds=round(replaced.out_s, 2), kind="relaunch"))
    cycles_artifact(ctx.totals.cycles)
    return True


def last_line(log: str) -> str:
    """The server log's last line: SGLang's, or the simulator's, reason for exiting."""
    line = log_tail(log, 1).strip()
    return f"its log ends: {line[:200]!r}" if line else "its log is empty or gone"
