"""Canary and rolling restart: a configuration change earned by measurement, never by
stopping the fleet.

A candidate first runs on k of N servers while the other N−k keep the current config. Both
groups draw from one queue — the same workload over the same minutes — so their per-server
rates compare directly, and the comparison is the decision: if the canary wins by
`canary_min_gain`, the other servers follow one at a time (the fleet keeps ≥ (N−1)/N of
its servers generating); if not, the canary goes back. The model's prediction only chooses
what to try; the ledger keeps predicted next to measured, so its error is on record.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from infra.sglang.client import ServerAnswerError
from tasks.fleet_config import FleetConfig
from tasks.fleet_control import DispatchEnded
from tasks.health import ServerStartFailed, StartAborted
from tasks.local_servers import LaunchError
from tasks.monitor import FleetMonitor, Sample
from tasks.rolling import RollingFleet
from tasks.tuning.diagnosis import window_stats
from tasks.tuning.judge import Verdict, group_rates, judge
from tasks.tuning.underfed import feedable, underfed

# Windows from a canary's start: one of warm-up, at least two judged, and at most this many
# before the judge must decide (tasks/tuning/judge.py: turnover and noise, else keep).
MIN_JUDGE_WINDOWS = 3.0
MAX_JUDGE_WINDOWS = 20.0

# canary_only: the canary won, but the work left would not pay for restarting the others;
# it keeps the new config and they the old one, to the job's end.
Outcome = Literal["rolled_out", "rolled_back", "start_failed", "aborted", "no_work",
                  "canary_only"]


@dataclass
class CanaryCycle:
    """One canary cycle, as the ledger, the summary and the benchmark see it."""

    candidate: str
    canary_servers: list[str]
    predicted_gain: float | None
    started_at: float  # monitor clock (seconds since the run began)
    outcome: Outcome = "aborted"
    canary_tok_s: float | None = None  # per server, modeled GPU time
    control_tok_s: float | None = None
    fleet_tok_s_before: float | None = None
    ended_at: float | None = None
    min_fleet_fraction: float | None = None  # lowest fleet rate during the cycle / before
    canary_retracted: float | None = None  # mean retracted requests per sample, per group
    control_retracted: float | None = None
    canary_cache_hit: float | None = None  # prefix-cache hit rate, per group
    control_cache_hit: float | None = None
    note: str = ""
    restarted: list[float] = field(default_factory=list)  # each restart's time out of dispatch
    starved_waits: int = 0  # windows not judged: the client machine starved (tasks/feed.py)

    @property
    def server_restarts(self) -> int:
        return len(self.restarted)

    @property
    def measured_gain(self) -> float | None:
        if self.canary_tok_s is None or not self.control_tok_s:
            return None
        return self.canary_tok_s / self.control_tok_s

    @property
    def prediction_error(self) -> float | None:
        """|predicted / measured − 1| of the move the canary measured."""
        gain = self.measured_gain
        if gain is None or self.predicted_gain is None or gain <= 0:
            return None
        return abs(self.predicted_gain / gain - 1.0)

    def record(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(measured_gain=self.measured_gain, prediction_error=self.prediction_error,
                   server_restarts=self.server_restarts)
        return out


def group_means(samples: list[Sample], since: float, until: float, canary: set[str],
                field: str) -> tuple[float | None, float | None]:
    """Mean of one sampled field (retracted, cache_hit_rate) for the canary and the rest."""
    ours: list[float] = []
    theirs: list[float] = []
    for s in samples:
        value = getattr(s, field)
        if since <= s.t <= until and s.alive and value is not None:
            (ours if s.server in canary else theirs).append(float(value))
    return (statistics.fmean(ours) if ours else None,
            statistics.fmean(theirs) if theirs else None)


def thrashes(cycle: CanaryCycle) -> bool:
    """The canary's scheduler keeps taking requests back (its cap is more than its pools
    sustain, e.g. KV growth of long outputs) while the others do not."""
    ours, theirs = cycle.canary_retracted, cycle.control_retracted
    return ours is not None and ours >= 0.5 and ours > 2 * (theirs or 0.0)


def fleet_rate(samples: list[Sample], since: float, until: float, time_scale: float) -> float:
    """The whole fleet's committed tok/s over [since, until] (sum over servers)."""
    windows = window_stats([s for s in samples if s.t <= until], since, time_scale)
    return sum(w.tok_s for w in windows)


def fleet_decode_rate(samples: list[Sample], since: float, until: float) -> float:
    """The fleet's decode tok/s over [since, until] from each server's `gen_throughput`
    gauge. For short windows: the finished-token counter moves in bursts as requests end, the
    gauge does not. A server that does not answer counts 0 — unless its token counter shows
    it kept running through the silence (a scrape that timed out on a busy client machine is
    not a stopped server; a restarted one starts its counter from 0)."""
    by_server: dict[str, list[Sample]] = {}
    for s in sorted(samples, key=lambda s: s.t):
        by_server.setdefault(s.server, []).append(s)
    total = 0.0
    for series in by_server.values():
        inside = [s for s in series if since <= s.t <= until]
        if not inside:
            continue
        values = [(s.gen_throughput or 0.0) if s.alive else None for s in inside]
        bridge = _silence_bridged(series, inside) if None in values else None
        if bridge is not None:
            values = [v for v in values if v is not None] or [bridge]
        total += statistics.fmean(v if v is not None else 0.0 for v in values)
    return total


def _silence_bridged(series: list[Sample], inside: list[Sample]) -> float | None:
    """The mean gauge of the answers around a server's unanswered scrapes in `inside` when its
    token counter kept counting across them (no restart), else None."""
    silent = [s.t for s in inside if not s.alive]
    before = [s for s in series if s.alive and s.t < silent[0]]
    after = [s for s in series if s.alive and s.t > silent[-1]]
    if not before or not after:
        return None
    first, last = before[-1], after[0]
    start, end = _tokens(first), _tokens(last)
    if start is None or end is None or end < start:
        return None
    return statistics.fmean([first.gen_throughput or 0.0, last.gen_throughput or 0.0])


def _tokens(sample: Sample) -> float | None:
    return (sample.decode_tokens_total if sample.decode_tokens_total is not None
            else sample.generation_tokens_total)


def min_fleet_fraction(samples: list[Sample], start: float, end: float, span_s: float,
                       ) -> float | None:
    """The lowest fleet decode rate over any `span_s` window inside [start, end], as a
    fraction of the rate over the `span_s` before `start`."""
    before = fleet_decode_rate(samples, start - span_s, start)
    if before <= 0 or end - start < span_s:
        return None
    ticks = sorted({s.t for s in samples if start + span_s <= s.t <= end})
    rates = [fleet_decode_rate(samples, t - span_s, t) for t in ticks]
    return min(rates) / before if rates else None


class CanaryRun:
    """Drives one cycle on a running fleet (blocking: it runs in the watch's thread)."""

    def __init__(self, fleet: RollingFleet, monitor: FleetMonitor, time_scale: float,
                 logger: Any, abort: threading.Event,
                 rollout_pays: Callable[[float, float], bool] | None = None) -> None:
        self.fleet = fleet
        self.monitor = monitor
        self.time_scale = time_scale
        self.logger = logger
        self.abort = abort
        # (measured gain, the canary's restart seconds) -> whether restarting the other
        # servers pays back over the work left (near the job's end it does not)
        self.rollout_pays = rollout_pays

    def run(self, current: FleetConfig, candidate: FleetConfig,
            predicted_gain: float | None) -> CanaryCycle:
        tuning = self.fleet.job.tuning
        order = sorted(self.fleet.config_of)
        canary = order[-tuning.canary_servers:]
        now = self.monitor.now()
        cycle = CanaryCycle(candidate.flags.fingerprint(), [f"server-{i}" for i in canary],
                            predicted_gain, now)
        cycle.fleet_tok_s_before = fleet_rate(self.monitor.snapshot(), now - tuning.window_s,
                                              now, self.time_scale)
        try:
            self._cycle(cycle, current, candidate, canary)
        except (StartAborted, DispatchEnded) as exc:
            # Keep the verdict when one came (a won canary whose rollout the job's end cut
            # short reads differently from one cut short before it was judged).
            verdict = f" after the verdict: {cycle.note}" if cycle.note else ""
            cycle.outcome, cycle.note = "aborted", str(exc).splitlines()[0] + verdict
        cycle.ended_at = self.monitor.now()
        cycle.min_fleet_fraction = min_fleet_fraction(
            self.monitor.snapshot(), cycle.started_at, cycle.ended_at, tuning.window_s / 2)
        return cycle

    def _cycle(self, cycle: CanaryCycle, current: FleetConfig, candidate: FleetConfig,
               canary: list[int]) -> None:
        if not self._move(cycle, canary, candidate, "canary"):
            self._move(cycle, canary, current, "restored")
            cycle.outcome = "start_failed"
            return
        verdict = self._await_verdict(cycle, self.monitor.now())
        gain = cycle.measured_gain
        if gain is None:
            cycle.outcome, cycle.note = "no_work", "no rate to compare (the work ran out?)"
            return
        if thrashes(cycle):
            cycle.note = (f"the canary retracted {cycle.canary_retracted:.1f} requests per "
                          f"sample (the others {cycle.control_retracted or 0:.1f}): its cap is "
                          "more than its pools sustain")
        if verdict.decision == "better" and not thrashes(cycle):
            restart_s = max(cycle.restarted, default=0.0)
            if self.rollout_pays is not None and not self.rollout_pays(gain, restart_s):
                cycle.outcome = "canary_only"
                cycle.note = (f"{verdict.reason}; the work left does not pay for restarting "
                              "the others: they keep the current config to the job's end")
                return
            rest = [i for i in sorted(self.fleet.config_of) if i not in canary]
            if self._move(cycle, rest, candidate, "rollout"):
                cycle.outcome = "rolled_out"
                return
            # A server would not start with it (another process on that GPU?): a fleet
            # half in one config and half in another is no state to leave a job in.
            moved = [i for i in sorted(self.fleet.config_of)
                     if self.fleet.config_of[i].flags != current.flags]
            self._move(cycle, moved, current, "restored")
            cycle.outcome = "start_failed"
        else:
            self._move(cycle, canary, current, "rollback")
            cycle.outcome = "rolled_back"

    def _await_verdict(self, cycle: CanaryCycle, up: float) -> Verdict:
        """Wait for a verdict the evidence supports. A fresh server admits a full batch at
        once, so its first requests finish together (one window of warm-up is skipped); the
        judge then waits for every server to turn its batch over and for a gain outside the
        noise, window by window, up to MAX_JUDGE_WINDOWS."""
        tuning = self.fleet.job.tuning
        window = tuning.window_s
        since = up + window
        self._wait_or_end(MIN_JUDGE_WINDOWS * window)
        while True:
            now = self.monitor.now()
            final = now - up >= MAX_JUDGE_WINDOWS * window
            starved = underfed(self.monitor.snapshot(), self.monitor.feed_snapshot(), since,
                               now, self._room())
            if starved is not None and not final:
                # The span starts again after the starved stretch: no verdict on the client.
                self.logger.info("canary on %s not judged: %s; waiting",
                                 ", ".join(cycle.canary_servers), starved)
                cycle.starved_waits += 1
                since = now
                self._wait_or_end(window)
                continue
            verdict = judge(self.monitor.snapshot(), since, now, set(cycle.canary_servers),
                            self.time_scale, tuning.canary_min_gain, final=final)
            if starved is not None:  # out of time with only a starved span: keep, say why
                verdict = Verdict("keep", verdict.gain, verdict.noise, verdict.turned_over,
                                  f"no span the client fed ({starved})")
            if verdict.decision != "wait":
                break
            self._wait_or_end(window)
        self._judge(cycle, since)
        cycle.note = verdict.reason
        return verdict

    def _room(self) -> dict[str, int]:
        """What each server may be given at once as it runs now (the canary's its new cap)."""
        caps = {f"server-{c.index}": c.max_running_requests for c in self.fleet.capacities()}
        return feedable(caps, {f"server-{i}": config.concurrency
                               for i, config in self.fleet.config_of.items()})

    def _wait_or_end(self, seconds: float) -> None:
        self.abort.wait(seconds)
        if self.abort.is_set():
            raise DispatchEnded("the epoch ended during the canary's window")

    def _judge(self, cycle: CanaryCycle, since: float) -> None:
        """Side by side over [since, now]: committed tok/s, retractions, cache hits."""
        rows, until, names = self.monitor.snapshot(), self.monitor.now(), set(cycle.canary_servers)
        cycle.canary_tok_s, cycle.control_tok_s = group_rates(rows, since, until, names,
                                                              self.time_scale)
        cycle.canary_retracted, cycle.control_retracted = group_means(rows, since, until, names,
                                                                      "retracted")
        cycle.canary_cache_hit, cycle.control_cache_hit = group_means(rows, since, until, names,
                                                                      "cache_hit_rate")

    def _move(self, cycle: CanaryCycle, indexes: list[int], config: FleetConfig,
              tag: str) -> bool:
        """Restart these servers on `config`, one at a time (the rest of the fleet keeps
        generating). False when a start failed."""
        for index in indexes:
            try:
                done = self.fleet.replace(index, config, tag)
            except StartAborted:
                raise
            except (ServerStartFailed, LaunchError, ServerAnswerError) as exc:
                self.logger.warning("server-%d did not come up as %s: %s", index, tag,
                                    str(exc).splitlines()[0])
                cycle.note = f"server-{index} ({tag}): {str(exc).splitlines()[0][:300]}"
                return False
            if done.restarted:
                cycle.restarted.append(round(done.out_s, 2))
        return True
