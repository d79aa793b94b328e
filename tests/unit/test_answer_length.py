"""The mean answer length the tuner scores moves with, while long answers still run
(tasks/tuning/diagnosis.generated_per_finished): a closed loop of lognormal answers."""

from __future__ import annotations

import math
import random

from tasks.monitor import Sample
from tasks.tuning.diagnosis import generated_per_finished


def lognormal(rng: random.Random, mean: float, p99: float) -> int:
    z = 2.3263
    sigma = z - math.sqrt(z * z - 2 * math.log(p99 / mean))
    return max(16, int(rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)))


def closed_loop(steps: int, slots: int = 49, seed: int = 1) -> tuple[list[Sample], float]:
    """One server decoding `slots` answers a step (mean 2,000, p99 16,000 tokens), a sample
    every 250 steps; returns the samples and the committed mean (tokens ÷ answers finished)."""
    rng = random.Random(seed)
    length = [lognormal(rng, 2000, 16000) for _ in range(slots)]
    left = list(length)
    decoded = finished = committed = 0
    samples = []
    for step in range(1, steps + 1):
        for i in range(slots):
            left[i] -= 1
            decoded += 1
            if left[i] <= 0:
                finished += 1
                committed += length[i]
                length[i] = left[i] = lognormal(rng, 2000, 16000)
        if step % 250 == 0:
            samples.append(Sample(step, 1, "s0", True, slots, 0, 0.5, 0.5, None, committed,
                                  requests_total=finished, decode_tokens_total=decoded))
    return samples, committed / max(finished, 1)


def test_long_answers_still_running_count_towards_the_mean() -> None:
    """After 3,000 steps the committed mean reads 706 (short answers finished first); tokens
    generated per answer finished read 1,564 — a move scored on 706 would admit twice the
    requests its KV pool holds for these answers."""
    samples, committed_mean = closed_loop(3000)
    live = generated_per_finished(samples)
    assert live is not None
    assert committed_mean < 800 and 1400 < live < 2100
    # a server restarted mid-run (a canary): its counters start again, nothing is lost
    restarted = [*samples, *[Sample(s.t + 3000, 2, "s0", True, 49, 0, 0.5, 0.5, None, None,
                                    requests_total=s.requests_total,
                                    decode_tokens_total=s.decode_tokens_total)
                             for s in samples]]
    assert generated_per_finished(restarted) == live


def test_too_few_answers_or_no_decode_counter_give_no_figure() -> None:
    samples, _ = closed_loop(250)
    assert generated_per_finished(samples[:1]) is None  # under 20 answers finished
    older = [Sample(s.t, 1, "s0", True, 49, 0, 0.5, 0.5, None, s.generation_tokens_total,
                    requests_total=s.requests_total) for s in closed_loop(3000)[0]]
    assert generated_per_finished(older) is None  # SGLang before 0.5.17: no decode counter
