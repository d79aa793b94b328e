"""A starved client is told from a slow configuration: the probe's arithmetic on the kernel's
per-thread counters, which windows count as underfed, and that the watch and the canary do not
judge on them (tasks/feed.py, tasks/tuning/underfed.py). The probe on real starvation:
tests/integration/test_feed_starvation.py."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from tasks.feed import FeedProbe, FeedSample, slowed_share, starved_times
from tasks.monitor import FleetMonitor, Sample, SGLangMetrics
from tasks.tuning.canary import CanaryCycle, CanaryRun
from tasks.tuning.underfed import fed_samples, feedable, underfed
from tasks.tuning.watch import RegressionWatch, WatchTargets


def _threads(root: Path, times: dict[str, tuple[int, int]]) -> None:
    for tid, (run, wait) in times.items():
        (root / tid).mkdir(exist_ok=True)
        (root / tid / "schedstat").write_text(f"{run} {wait} 7\n")


def test_the_share_is_the_most_slowed_active_thread(tmp_path: Path) -> None:
    _threads(tmp_path, {"1": (0, 0), "2": (0, 0)})
    ticks = iter([0.0, 1.0])  # a one-second interval, whatever the test's own speed
    probe = FeedProbe(tmp_path, clock=lambda: next(ticks))
    # thread 1 ran 0.3 s and waited 0.3 s; thread 2 barely woke (inactive: not counted)
    _threads(tmp_path, {"1": (300_000_000, 300_000_000), "2": (1_000, 9_000)})
    share = probe.read(1.0).wait_share
    assert share is not None and abs(share - 0.5) < 1e-9


def test_inactive_threads_and_new_threads_do_not_count() -> None:
    wall = 1e9
    before = {"1": (0, 0)}
    assert slowed_share(before, {"1": (10_000_000, 30_000_000)}, wall) == 0.0  # 4 % runnable
    assert slowed_share(before, {"1": (0, 0), "9": (0, 900_000_000)}, wall) == 0.0


def test_no_counters_claim_nothing(tmp_path: Path) -> None:
    sample = FeedProbe(tmp_path / "not-proc").read(1.0)
    assert sample.wait_share is None and not sample.starved


def _samples(t0: float, t1: float, running: int, queued: int) -> list[Sample]:
    return [Sample(float(t), 1, s, True, running, queued, 0.5, 0.5, 100.0, 100.0 * t)
            for t in range(int(t0), int(t1) + 1) for s in ("server-0", "server-1")]


def _feed(t0: float, t1: float, share: float) -> list[FeedSample]:
    return [FeedSample(float(t), share) for t in range(int(t0), int(t1) + 1)]


CAPS = {"server-0": 32, "server-1": 32}


def test_a_starved_client_that_leaves_servers_room_is_underfed() -> None:
    samples, feed = _samples(0, 10, 20, 0), _feed(0, 10, 0.6)
    why = underfed(samples, feed, 2.0, 10.0, CAPS)
    assert why is not None and "60%" in why and "server-0, server-1" in why


def test_starvation_alone_or_room_alone_is_no_reason() -> None:
    assert underfed(_samples(0, 10, 32, 3), _feed(0, 10, 0.6), 2.0, 10.0, CAPS) is None
    assert underfed(_samples(0, 10, 20, 0), _feed(0, 10, 0.05), 2.0, 10.0, CAPS) is None
    assert underfed(_samples(0, 10, 20, 0), [], 2.0, 10.0, CAPS) is None


def test_one_empty_scrape_is_no_evidence_most_of_the_window_is() -> None:
    # full batches with a queue, but 3 of the window's 9 scrapes caught a batch turning over
    samples = [Sample(s.t, 1, s.server, True, *((5, 0) if s.t in (3, 6, 9) else (32, 2)),
                      0.5, 0.5, 100.0, 100.0 * s.t) for s in _samples(0, 10, 32, 2)]
    feed = _feed(0, 10, 0.6)
    assert underfed(samples, feed, 2.0, 10.0, CAPS) is None
    emptier = [Sample(s.t, 1, s.server, True, *((32, 2) if s.t in (4, 8) else (5, 0)),
                      0.5, 0.5, 100.0, 100.0 * s.t) for s in samples]  # 7 of 9 empty
    assert underfed(emptier, feed, 2.0, 10.0, CAPS) is not None


def test_a_server_the_clients_own_setting_holds_below_its_cap_is_not_starved() -> None:
    # 20 running of cap 32 with nothing queued, beside a starved client: underfed, unless
    # the client may only send 20 at once (its concurrency setting: client-bound, a move)
    samples, feed = _samples(0, 10, 20, 0), _feed(0, 10, 0.6)
    held = feedable(CAPS, {"server-0": 20, "server-1": 20})
    assert held == {"server-0": 20, "server-1": 20}
    assert underfed(samples, feed, 2.0, 10.0, held) is None
    assert feedable(CAPS, {"server-0": 64, "server-1": None}) == CAPS
    why = underfed(samples, feed, 2.0, 10.0, feedable(CAPS, {"server-0": 20}))
    assert why is not None and "server-1 had room" in why


def test_the_epochs_measure_leaves_out_the_ticks_the_client_did_not_feed() -> None:
    samples = _samples(0, 20, 32, 2)
    feed = _feed(0, 9, 0.0) + _feed(10, 20, 0.7)
    hungry = [Sample(s.t, s.epoch, s.server, True, 5, 0, 0.1, 0.1, 10.0, 0.0)
              for s in samples if s.t >= 12]
    kept = fed_samples([s for s in samples if s.t < 12] + hungry, feed, CAPS)
    assert {s.t for s in kept} == {float(t) for t in range(12)}
    assert starved_times(feed)[0] == (9.0, 10.0)


def _monitor(samples: list[Sample], feed: list[FeedSample]) -> FleetMonitor:
    monitor = FleetMonitor(1.0, None, SGLangMetrics())
    monitor.samples, monitor.feed = samples, feed
    return monitor


def test_the_watch_does_not_judge_a_window_about_the_client() -> None:
    from tasks.tuning.diagnosis import Diagnosis

    monitor = _monitor(_samples(0, 10, 20, 0), _feed(0, 10, 0.6))
    watch = RegressionWatch(monitor, WatchTargets(CAPS, None, window_s=4.0,
                                                  baseline_tok_s_per_gpu=1000.0),
                            True, None, lambda d: 1.0)
    watch._turned_over, watch._span = True, (2.0, 10.0)
    slow = Diagnosis("client-bound", "running 20 of cap 32, queue 0", 100.0)
    assert watch._reason(slow) == "" and watch._reason(slow) == ""  # never a rollback
    assert watch.result.last_check.startswith("not judged: the client was CPU-starved")


class _Clocked(CanaryRun):
    """A canary whose waits advance a modeled clock instead of sleeping."""

    def __init__(self, monitor: Any, feed_until: float) -> None:
        from infra.settings import JobSettings
        from tasks.capacity import Capacity
        from tasks.fleet_config import FleetConfig

        caps = [Capacity(i, "", None, 32, 1, None, None, "") for i in (0, 1)]
        job = JobSettings.model_validate({"tuning": {"window_s": 4.0, "canary_min_gain": 1.2}})
        fleet = type("Fleet", (), {"capacities": lambda self: caps, "job": job,
                                   "config_of": dict.fromkeys((0, 1), FleetConfig.of(job))})()
        super().__init__(fleet, monitor, 1.0, _Log(), threading.Event())
        self.feed_until = feed_until


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, msg: str, *args: object) -> None:
        self.lines.append(msg % args)


class _ClockMonitor:
    def __init__(self, starved_until: float) -> None:
        self.t = 0.0
        self.starved_until = starved_until

    def now(self) -> float:
        return self.t

    def snapshot(self) -> list[Sample]:
        """Starved: both servers with room, the canary (server-1) reading 0.9x the control;
        fed: full batches, the canary at 2x."""
        rows, counts = [], {"server-0": 0.0, "server-1": 0.0}
        for t in range(int(self.t) + 1):
            room = t <= self.starved_until
            for s in counts:
                rate = 100.0 if s == "server-0" else (90.0 if room else 200.0)
                counts[s] += rate
                rows.append(Sample(float(t), 1, s, True, 20 if room else 32, 0 if room else 2,
                                   0.5, 0.5, rate, counts[s], requests_total=40.0 * t))
        return rows

    def feed_snapshot(self) -> list[FeedSample]:
        return [FeedSample(float(t), 0.6 if t <= self.starved_until else 0.0)
                for t in range(int(self.t) + 1)]


def _await(starved_until: float) -> tuple[CanaryCycle, Any, _Log]:
    monitor = _ClockMonitor(starved_until)
    run = _Clocked(monitor, starved_until)

    def advance(seconds: float) -> None:
        monitor.t += seconds

    run._wait_or_end = advance  # type: ignore[method-assign]
    cycle = CanaryCycle("x", ["server-1"], 2.0, 0.0)
    verdict = run._await_verdict(cycle, 0.0)
    return cycle, verdict, run.logger


def test_a_canary_is_judged_only_once_the_client_feeds_the_servers() -> None:
    cycle, verdict, log = _await(starved_until=30.0)
    # judged on the fed span alone: the starved one read the canary at 0.9x
    assert cycle.starved_waits >= 4 and verdict.decision == "better"
    assert verdict.gain is not None and verdict.gain > 1.8
    assert any("not judged: the client was CPU-starved" in line for line in log.lines)


def test_a_canary_the_client_never_fed_is_kept_out() -> None:
    _, verdict, _ = _await(starved_until=1e9)
    assert verdict.decision == "keep" and "no span the client fed" in verdict.reason


def test_a_config_whose_servers_were_not_fed_is_not_rolled_back() -> None:
    from tasks.tuning.diagnosis import Diagnosis

    watch = RegressionWatch(_monitor([], []), WatchTargets(CAPS, None, window_s=4.0,
                                                           baseline_tok_s_per_gpu=518.0),
                            True, None, lambda d: 1.0)
    watch._turned_over = True
    unfed = Diagnosis("client-bound", "running 20 of cap 122, queue 0.3", 279.0)
    assert [watch._reason(unfed) for _ in range(3)] == ["", "", ""]
    assert "not a rollback" in watch.result.last_check
    full = Diagnosis("mamba-bound", "running 122 of cap 122, queue 4", 279.0)
    assert watch._reason(full) == "" and watch._reason(full).startswith("rollback")
