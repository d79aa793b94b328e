"""How long the job's answers run, read from the answers committed so far — the tail included.

When the rows do not fix their lengths (text rows, EOS on), the tuner knows the answers only
from what has come back. Its predictor used the mean alone, as if every answer were that long:
then a configuration that holds cap × (prompt + mean) in KV looks safe, and with a reasoning
model's tail (mean 2,000, p99 16,000) it fills its KV with the long ones and retracts — the
long-mixed bench's canary rolled out a cap-138 configuration that retracted 19 times and
committed 0.86 of the best (#26, over-admission). Here a p99 goes to the predictor too: a
lognormal through the servers' own mean and the committed answers' median (`p99`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable

SAMPLE_SIZE = 10_000  # a uniform sample of every committed answer (reservoir)
MIN_SAMPLE = 100  # below it a median is a few answers' length
Z99 = 2.326  # the standard normal's 99th percentile


class AnswerLengths:
    """A uniform sample of committed answers' lengths (completion tokens)."""

    def __init__(self, seed: int = 0) -> None:
        self._sample: list[int] = []
        self._seen = 0
        self._rng = random.Random(seed)

    def add(self, lengths: Iterable[int]) -> None:
        for n in lengths:
            self._seen += 1
            if len(self._sample) < SAMPLE_SIZE:
                self._sample.append(n)
            else:
                slot = self._rng.randrange(self._seen)
                if slot < SAMPLE_SIZE:
                    self._sample[slot] = n

    def p99(self, mean_estimate: float) -> int | None:
        """The answers' p99 for a job whose mean answer is `mean_estimate` tokens (None: too
        few answers yet to tell).

        Lognormal, from the mean and the committed answers' median: early in a job the
        answers that have come back are the short ones, so their own p99 reads the longest
        answer finished so far (6,100 where the job's is 16,000), while their median is
        nearly right — about half of the answers are short — and the mean comes from the
        servers' own counters. mean / median = exp(σ²/2) gives σ, and p99 = median ×
        exp(2.326 σ). Alike answers (mean ≈ median) get no tail."""
        if len(self._sample) < MIN_SAMPLE:
            return None
        ordered = sorted(self._sample)
        median = float(ordered[len(ordered) // 2])
        mean = max(mean_estimate, sum(ordered) / len(ordered))
        if median <= 0:
            return None
        sigma = math.sqrt(2.0 * math.log(max(mean, median) / median))
        return round(median * math.exp(Z99 * sigma))
