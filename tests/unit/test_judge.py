"""The canary's judge against the misjudgement long outputs caused: a canary whose first batch
of 2,048-token answers had not finished read a third of the control's rate over its first
windows, and a move that was faster was rolled back. The fleet here is modeled exactly as
SGLang counts: tokens and requests are added to the counters when a request finishes."""

from __future__ import annotations

import pytest

from tasks.monitor import Sample
from tasks.tuning.canary import MAX_JUDGE_WINDOWS, MIN_JUDGE_WINDOWS, group_rates
from tasks.tuning.judge import judge

WINDOW = 20.0
OUT = 2048  # tokens per answer
RUNNING = 8  # each server's batch


def server_samples(name: str, rate: float, fresh: bool, until: float) -> list[Sample]:
    """A server decoding RUNNING requests at `rate` tok/s. A fresh one starts them all at
    t=0, so they finish together (a wave) and then fall out of step; a steady one finishes
    one every OUT·RUNNING/rate/RUNNING seconds from the start."""
    per_request = OUT * RUNNING / rate  # seconds a request takes at this batch
    gap = per_request / RUNNING
    if fresh:  # one short answer early, the rest of the first batch together, then one at a
        # time as its slots refill unevenly
        finishes = ([per_request / 4] + [per_request] * (RUNNING - 1)
                    + [per_request + gap * (k + 1) for k in range(400)])
    else:
        finishes = [gap * (k + 1) for k in range(800)]
    rows, t = [], 0.0
    while t <= until:
        done = sum(1 for f in finishes if f <= t)
        rows.append(Sample(t, 1, name, True, RUNNING, 2, 0.3, 0.9, rate, float(done * OUT),
                           0.0, 0.0, float(done)))
        t += 0.5
    return rows


def fleet(canary_rate: float, control_rate: float, until: float) -> list[Sample]:
    rows = server_samples("server-3", canary_rate, True, until)
    for i in range(3):
        rows += server_samples(f"server-{i}", control_rate, False, until)
    return sorted(rows, key=lambda s: s.t)


def test_the_first_window_rule_reads_the_wave_and_the_judge_waits() -> None:
    rows = fleet(canary_rate=160.0, control_rate=109.0, until=MIN_JUDGE_WINDOWS * WINDOW)
    ours, theirs = group_rates(rows, WINDOW, MIN_JUDGE_WINDOWS * WINDOW, {"server-3"}, 1.0)
    # what fooled the old rule: one early answer over the judging windows, a third of the rate
    assert ours is not None and theirs is not None and theirs == pytest.approx(109.0, rel=0.2)
    assert ours / theirs < 0.5
    verdict = judge(rows, WINDOW, MIN_JUDGE_WINDOWS * WINDOW, {"server-3"}, 1.0, 1.1,
                    final=False)
    assert verdict.decision == "wait" and "first batch" in verdict.reason


def test_once_the_canary_turned_over_the_faster_move_rolls_out() -> None:
    decided = None
    t = MIN_JUDGE_WINDOWS * WINDOW
    while t <= MAX_JUDGE_WINDOWS * WINDOW:
        rows = fleet(160.0, 109.0, t)
        verdict = judge(rows, WINDOW, t, {"server-3"}, 1.0, 1.1,
                        final=t >= MAX_JUDGE_WINDOWS * WINDOW)
        if verdict.decision != "wait":
            decided = verdict
            break
        t += WINDOW
    assert decided is not None and decided.decision == "better", decided
    assert decided.gain == pytest.approx(160.0 / 109.0, rel=0.15)


@pytest.mark.parametrize("canary_rate", [109.0, 70.0])
def test_a_move_that_is_not_better_is_kept_out(canary_rate: float) -> None:
    t = MIN_JUDGE_WINDOWS * WINDOW
    while True:
        final = t >= MAX_JUDGE_WINDOWS * WINDOW
        verdict = judge(fleet(canary_rate, 109.0, t), WINDOW, t, {"server-3"}, 1.0, 1.1, final)
        if verdict.decision != "wait":
            break
        t += WINDOW
    assert verdict.decision == "keep", verdict


def test_a_starved_client_that_scrapes_late_does_not_flip_the_verdict() -> None:
    """Scrapes that come late and unevenly (a busy client CPU) thin the samples of every
    server alike: the verdict on the same fleet stays the same."""
    until = MAX_JUDGE_WINDOWS * WINDOW
    rows = fleet(160.0, 109.0, until)
    thinned = [s for i, s in enumerate(rows) if (i * 7919) % 5 < 2]  # 40 %, unevenly
    full = judge(rows, WINDOW, until, {"server-3"}, 1.0, 1.1, final=True)
    starved = judge(thinned, WINDOW, until, {"server-3"}, 1.0, 1.1, final=True)
    assert full.decision == starved.decision == "better"


def test_the_decode_token_counter_reads_the_rate_before_any_answer_finished() -> None:
    """Two servers decode 1,000 tok/s each; 4,000-token answers, none finished in the first
    20 s. The finished-token counter reads 0 for the first and a wave for the second (its
    batch began earlier); SGLang's realtime_tokens_total{mode="decode"} reads the rate."""
    from tasks.tuning.diagnosis import window_stats

    rows = []
    for i in range(21):
        t = float(i)
        rows.append(Sample(t, 1, "fresh", True, 8, 0, 0.3, 0.5, 1000.0, 0.0,
                           decode_tokens_total=1000.0 * t))
        wave = 32_000.0 if t >= 10 else 0.0  # 8 answers of 4,000 tokens land at once
        rows.append(Sample(t, 1, "older", True, 8, 0, 0.3, 0.5, 1000.0, wave,
                           decode_tokens_total=1000.0 * t))
    rates = {w.server: w.tok_s for w in window_stats(rows, 0.0, 1.0)}
    assert rates == pytest.approx({"fresh": 1000.0, "older": 1000.0})
    old_style = [Sample(s.t, 1, s.server, True, 8, 0, 0.3, 0.5, 1000.0,
                        s.generation_tokens_total) for s in rows]
    rates = {w.server: w.tok_s for w in window_stats(old_style, 0.0, 1.0)}
    assert rates["older"] == pytest.approx(1600.0)  # a wave, not a rate (32,000 / 20 s)
