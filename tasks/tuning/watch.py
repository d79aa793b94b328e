"""The watch thread of one epoch: when to stop dispatch and restart (a better config, a
throughput under target) or roll back (slower than the best earlier config).
"""

from __future__ import annotations

import contextvars
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from infra.sglang.memory import MemoryPlan
from tasks.monitor import FleetMonitor
from tasks.tuning.diagnosis import (
    Diagnosis,
    diagnose,
    slow_servers,
    steady_tok_s_per_gpu,
    window_stats,
)
from tasks.tuning.judge import turnover_start
from tasks.tuning.policy import Proposal
from tasks.tuning.underfed import fed_samples, feedable, underfed

LOOKBACK_WINDOWS = 20  # the furthest a measurement looks back for a turnover


@dataclass
class WatchResult:
    triggered: bool = False
    reason: str = ""
    diagnosis: Diagnosis | None = None
    measured_tok_s_per_gpu: float | None = None
    triggered_at: float | None = None  # time.monotonic() of the trigger
    required_gain: float | None = None  # what a restart had to promise at the last check
    last_check: str = ""  # the last check's verdict, for the log when nothing triggered


@dataclass
class WatchTargets:
    """What one configuration is judged against: each server's request cap, the memory
    model's view of its pools, the clock, the window, the user's target and the best rate
    an earlier configuration held (a rollback's bar)."""

    caps: dict[str, int]
    plan: MemoryPlan | None
    time_scale: float = 1.0
    window_s: float = 30.0
    target_tok_s_per_gpu: float | None = None
    baseline_tok_s_per_gpu: float | None = None
    concurrency_per_server: int | None = None  # the client's setting (None: cap + queue)


class RegressionWatch:
    """Watches one epoch; sets `stop` when a restart would pay off (or a rollback is due).

    Triggers after `window_s` of steady state when (a) throughput stays below the target, or
    (b) the diagnosis is a pool/client limit and the policy has a proposal, or (c) this
    config is slower than the best earlier one (rollback)."""

    def __init__(self, monitor: FleetMonitor, targets: WatchTargets, enabled: bool,
                 can_propose: Callable[[Diagnosis, float], Proposal | None] | None = None,
                 gain_needed: Callable[[Diagnosis], float] | None = None) -> None:
        self.monitor = monitor
        self.caps = targets.caps
        self.concurrency = targets.concurrency_per_server
        self.plan = targets.plan
        self.time_scale = targets.time_scale
        self.window_s = targets.window_s
        self.target = targets.target_tok_s_per_gpu
        self.baseline = targets.baseline_tok_s_per_gpu
        self.can_propose = can_propose  # (diagnosis, least gain) -> Proposal | None
        self.enabled = enabled
        self.gain_needed = gain_needed  # diagnosis -> least predicted gain worth a restart
        # (diagnosis, proposal) -> True when it was handled without stopping the fleet (a
        # canary cycle, or advice); False: stop the epoch for a whole-fleet restart.
        self.on_proposal: Callable[[Diagnosis, Proposal], bool] | None = None
        # diagnosis -> True when the slow servers of an asymmetric fleet were restarted
        # alone (tasks/tuning/repair.py)
        self.on_asymmetric: Callable[[Diagnosis], bool] | None = None
        # () -> True when servers whose process was gone were started again
        # (tasks/tuning/repair.py); looked at on every check, with tuning on or off.
        self.on_dead: Callable[[], bool] | None = None
        # Servers the job does not own (engine=external): a reason is reported, never acted
        # on — the epoch is not stopped for a fleet restart nobody can carry out.
        self.advise_only = False
        # verdict -> None, after every check (tasks/tuning/watch.CheckLog writes them out)
        self.on_check: Callable[[str], None] | None = None
        # diagnosis -> wall seconds the fleet needs for the work left (a rollout's payback)
        self.work_left_s: Callable[[Diagnosis], float] | None = None
        self._slow_streak: dict[str, int] = {}  # checks in a row a server was the slow one
        self._proposal: Proposal | None = None
        self.stop = threading.Event()
        self.result = WatchResult()
        self._slow_checks = 0
        self._turned_over = False  # the last measurement's span held a full turnover
        self._span = (0.0, 0.0)  # the last measurement's [since, until]
        self._done = threading.Event()  # also the canary's abort: set when the epoch ends
        self._started = monitor.now()
        # With the flow run's context, so what a canary cycle logs and records (artifacts)
        # belongs to the run.
        self._thread = threading.Thread(target=contextvars.copy_context().run,
                                        args=(self._run,), name="regression-watch",
                                        daemon=True)

    def start(self) -> RegressionWatch:
        self._thread.start()
        return self

    @property
    def watching(self) -> bool:
        """Whether the watch's thread runs (only it relaunches dead servers)."""
        return self._thread.is_alive()

    def close(self) -> WatchResult:
        """Stop watching; the result's throughput is the median per-tick rate of the epoch
        after warm-up (robust to the job's tail, when the fleet runs out of work). Waits for
        a canary cycle in progress to give up (its waits end when `_done` is set)."""
        self._done.set()
        self._thread.join()
        if not self.result.triggered:
            self._measure()
        # (ticks at which a starved client left a server with room unfed measure the client)
        fed = fed_samples(self.monitor.snapshot(), self.monitor.feed_snapshot(), self._room())
        steady = steady_tok_s_per_gpu(fed, self._started + self.window_s / 2, self.time_scale)
        if steady is not None and not self.result.triggered:
            self.result.measured_tok_s_per_gpu = steady
        return self.result

    def _measure(self) -> Diagnosis:
        # Skip the first half window: admission ramp-up is not steady state. Look back one
        # window, or further until every server has turned its batch over: with long outputs
        # the finished-token counter moves in waves, and a window inside one reads a third of
        # the rate (tasks/tuning/judge.py).
        now, samples = self.monitor.now(), self.monitor.snapshot()
        # (at most LOOKBACK_WINDOWS back: a 40-hour epoch's samples are not rescanned)
        earliest = max(self._started + self.window_s / 2, now - LOOKBACK_WINDOWS * self.window_s)
        since = max(earliest, now - self.window_s)
        start = turnover_start(samples, earliest, now)
        self._turned_over = start is not None
        if start is not None:
            since = min(since, start)
        self._span = (since, now)
        windows = window_stats(samples, since, self.time_scale)
        diag = diagnose(windows, self.caps, self.plan)
        self.result.diagnosis = diag
        self.result.measured_tok_s_per_gpu = diag.tok_s_per_gpu if windows else None
        return diag

    def reconfigured(self, caps: dict[str, int], plan: MemoryPlan | None,
                     baseline_tok_s_per_gpu: float | None,
                     concurrency_per_server: int | None = None) -> None:
        """The fleet changed config under the watch (a rollout): judge the new one afresh."""
        self.caps, self.plan = caps, plan
        self.concurrency = concurrency_per_server
        self.baseline = baseline_tok_s_per_gpu
        self._started = self.monitor.now()
        self._slow_checks = 0
        self._slow_streak = {}

    def _room(self) -> dict[str, int]:
        """What each server may be given at once: a starved client is no reason to wait
        where the client's own setting holds a server below its cap."""
        return feedable(self.caps, dict.fromkeys(self.caps, self.concurrency))

    def _run(self) -> None:
        first_check = self._started + 1.5 * self.window_s
        while not self._done.wait(self.check_interval_s()):
            if self.on_dead is not None and self.on_dead():
                first_check = self.monitor.now() + 1.5 * self.window_s
                self.result.last_check = "after relaunching a server that died: no check yet"
                continue
            if not self.enabled or self.monitor.now() < first_check:
                continue
            diag = self._measure()
            if self._repaired(diag):
                first_check = self.monitor.now() + 1.5 * self.window_s
                self.result.last_check = "after restarting a slow server alone: no check yet"
                continue
            self._proposal = None
            reason = self._reason(diag)
            if self.on_check is not None and self.result.last_check:
                self.on_check(self.result.last_check)
            if (reason and self._proposal is not None and self.on_proposal is not None
                    and self.on_proposal(diag, self._proposal)):
                # The cycle ran while the fleet generated; look again a window later.
                first_check = self.monitor.now() + 1.5 * self.window_s
                self.result.last_check = f"after a canary cycle on {diag.kind}: no check yet"
                continue
            if reason and self.advise_only:
                self.result.last_check = f"{reason} (engine=external: not acted on)"
                continue
            if reason:
                self.result.triggered = True
                self.result.triggered_at = time.monotonic()
                self.result.reason = reason
                self.stop.set()
                return

    def check_interval_s(self) -> float:
        return min(1.0, self.window_s / 4)

    def _repaired(self, diag: Diagnosis) -> bool:
        """A server slow in every check for two windows running — not one slow window: with
        long requests a server's committed tokens come in waves, and a server just restarted
        is still filling up — is handed to `on_asymmetric`, which restarts it alone, once."""
        # (rates come from the decode-token counter, so a server just rolled out onto a new
        # config reads its rate, not the 0 of answers not finished yet; no turnover is awaited:
        # a slow GPU is the last to turn its batch over)
        slow = {name for name, _, _ in slow_servers(diag)} if diag.kind == "asymmetric" else set()
        self._slow_streak = {n: self._slow_streak.get(n, 0) + 1 for n in slow}
        needed = math.ceil(2 * self.window_s / self.check_interval_s())
        if self.on_asymmetric is None or not any(v >= needed for v in self._slow_streak.values()):
            return False
        self._slow_streak = {}
        return self.on_asymmetric(diag)

    def _reason(self, diag: Diagnosis) -> str:
        tok = diag.tok_s_per_gpu
        need = self.gain_needed(diag) if self.gain_needed is not None else 1.0
        self.result.required_gain = need
        if diag.kind == "unhealthy":
            return f"unhealthy: {diag.evidence}"
        starved = underfed(self.monitor.snapshot(), self.monitor.feed_snapshot(), *self._span,
                           self._room())
        if starved is not None:  # no decision on a window about the client machine
            self.result.last_check = f"not judged: {starved}; waiting"
            return ""
        if not self._turned_over:  # no decision on a wave
            self.result.last_check = (f"{diag.kind} at {tok:,.0f} tok/s per GPU: waiting "
                                      "for every server to turn its batch over")
            return ""
        if diag.kind == "client-bound" and self.baseline and tok < 0.95 * self.baseline:
            # Servers with room and nothing queued did not get the work to show their speed:
            # a window that says nothing about the configuration is no reason to roll it back
            # (a loaded client machine once took a 3.6x move back to its start this way).
            self._slow_checks = 0
            self.result.last_check = (f"client-bound at {tok:,.0f} tok/s per GPU, below the "
                                      f"best earlier config's {self.baseline:,.0f}: not a "
                                      f"rollback ({diag.evidence})")
            return ""
        if self.baseline and tok < 0.95 * self.baseline and self.baseline >= need * tok:
            # Two checks in a row: one slow window can be ramp-up or a noisy neighbour.
            self._slow_checks += 1
            if self._slow_checks >= 2:
                return (f"rollback: {tok:,.0f} tok/s per GPU is slower than the best earlier "
                        f"config ({self.baseline:,.0f}) in two windows running")
            return ""
        self._slow_checks = 0
        below = self.target is not None and tok < self.target
        proposal = (self.can_propose(diag, need)
                    if self.can_propose is not None and math.isfinite(need) else None)
        self._proposal = proposal
        self.result.last_check = (
            f"{diag.kind} at {tok:,.0f} tok/s per GPU ({diag.evidence}); a restart had to "
            f"promise ≥ {need:.2f}× to pay for itself over the work left; "
            + (f"best candidate: {proposal.reason}" if proposal is not None
               else "no candidate did"))
        if below and proposal is not None:
            return (f"{tok:,.0f} tok/s per GPU is below the target {self.target:,.0f}; "
                    f"{diag.kind}: {diag.evidence}")
        if proposal is not None and diag.kind in ("mamba-bound", "kv-bound", "request-capped",
                                                  "client-bound"):
            return f"{diag.kind}: {diag.evidence}"
        return ""


class CheckLog:
    """The watch's verdicts in the run's log: a check whose verdict starts differently from
    the last one logged (another diagnosis, a candidate where there was none), at most one
    such line per tenth of `every_s` (a batch near its cap flips between two readings from
    one check to the next), and otherwise one every `every_s` seconds — so an operator reading
    a 40-hour run sees why no restart came, without a line a second."""

    def __init__(self, log: Callable[[str], object], every_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log, self._every_s, self._clock = log, every_s, clock
        self._last_gist: tuple[str, bool] | None = None
        self._last_at = -math.inf

    def __call__(self, verdict: str) -> None:
        gist = (verdict.split(" ", 1)[0], "best candidate:" in verdict)
        now = self._clock()
        quiet = now - self._last_at
        if quiet < self._every_s and (gist == self._last_gist or quiet < self._every_s / 10):
            return
        self._last_gist, self._last_at = gist, now
        self._log(f"check: {verdict}")
