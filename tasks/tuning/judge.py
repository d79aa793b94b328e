"""The canary's verdict: decided by evidence that long outputs cannot fool, or not at all.

SGLang counts generated tokens when a request *finishes* (`sglang:generation_tokens_total`),
so over a short window a freshly restarted server reads a wave, not a rate: a canary whose
first batch of 2,048-token answers had not finished read 32 tok/s per server against the
control's 109, and a winning move was rolled back. Two guards:

* **Turnover.** The judging span starts once the canary has finished its first batch (a
  fresh server's first requests all finish together, a wave), and no verdict comes until
  every server of both groups has finished, inside the span, at least as many requests as it
  ran at once (`sglang:num_requests_total` against the most it had running): a span that
  holds a full turnover holds whole waves, not a part of one.
* **Noise.** The span is cut into parts and the gain measured in each; their spread gives a
  standard error. The move rolls out when two standard errors below its gain still clear the
  bar — a gain only just above 1 ± a wide spread is an early span's wave, and the gain a
  rollout records is what the tuner's trust in its model is then measured by (a canary at
  1.49 ± 0.24 whose move runs 1.96× in steady state, tests/unit/test_wrong_prior.py); it is
  kept out when two standard errors above it
  stay under the bar; otherwise the judge waits for more, up to a time bound, after which
  the current configuration is kept ("keep": evidence that does not decide does not move).

A span in which a CPU-starved client left servers unfed measures the client machine, not the
move: the canary (tasks/tuning/canary.py) starts its span again after one
(tasks/tuning/underfed.py) before asking for a verdict.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Literal

from tasks.monitor import Sample
from tasks.tuning.diagnosis import window_stats

PARTS = 4  # sub-spans whose gains give the noise estimate
SIGMAS = 2.0

Decision = Literal["wait", "better", "keep"]


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    gain: float | None  # canary ÷ control, per server, over the whole span
    noise: float | None  # standard error of the gain, from the parts
    turned_over: bool
    reason: str


def group_rates(samples: list[Sample], since: float, until: float, canary: set[str],
                time_scale: float) -> tuple[float | None, float | None]:
    """Mean per-server tok/s of the canary group and of the others over [since, until]."""
    windows = window_stats([s for s in samples if s.t <= until], since, time_scale)
    ours = [w.tok_s for w in windows if w.server in canary and w.alive]
    theirs = [w.tok_s for w in windows if w.server not in canary and w.alive]
    return (statistics.fmean(ours) if ours else None,
            statistics.fmean(theirs) if theirs else None)


def turned_over(samples: list[Sample], since: float, until: float) -> tuple[bool, str]:
    """Every server finished at least as many requests as it ran at once, in the span."""
    by: dict[str, list[Sample]] = {}
    for s in samples:
        if since <= s.t <= until and s.alive:
            by.setdefault(s.server, []).append(s)
    if not by:
        return False, "no samples in the span"
    for server, rows in sorted(by.items()):
        counts = [r.requests_total for r in rows if r.requests_total is not None]
        most = max((r.running or 0) for r in rows)
        if not counts and all(r.requests_total is None for r in rows):
            continue  # a server without the counter (older SGLang) is judged on time alone
        if len(counts) < 2:
            return False, f"{server} reports no finished-request counter yet"
        if counts[-1] - counts[0] < max(1, most):
            return False, (f"{server} finished {counts[-1] - counts[0]:.0f} of the {most} "
                           "requests it ran at once")
    return True, "every server turned its batch over"


def turnover_start(samples: list[Sample], earliest: float, until: float) -> float | None:
    """The latest start ≥ `earliest` whose span to `until` holds a turnover of every server
    (None: none does yet) — the shortest look-back that reads rates, not waves."""
    ticks = sorted({s.t for s in samples if earliest <= s.t <= until}, reverse=True)
    recent = [s for s in samples if s.t >= earliest]
    for t in ticks:
        if turned_over(recent, t, until)[0]:
            return t
    return None


def first_turnover(samples: list[Sample], since: float, until: float,
                   servers: set[str]) -> float | None:
    """When every one of `servers` had finished, after `since`, as many requests as it
    ran at once: the end of a restarted server's first wave (None: not yet)."""
    pool = [s for s in samples if since <= s.t <= until and s.server in servers]
    for t in sorted({s.t for s in pool}):
        if turned_over(pool, since, t)[0]:
            return t
    return None


def _gain(samples: list[Sample], since: float, until: float, canary: set[str],
          time_scale: float) -> float | None:
    ours, theirs = group_rates(samples, since, until, canary, time_scale)
    return ours / theirs if ours is not None and theirs else None


def judge(samples: list[Sample], since: float, until: float, canary: set[str],
          time_scale: float, bar: float, final: bool) -> Verdict:
    """The verdict on [since, until]; `final`: the time bound is reached, decide now."""
    start = first_turnover(samples, since, until, canary)
    if start is None:
        return Verdict("keep" if final else "wait", None, None, False,
                       "the canary has not finished its first batch"
                       + (" by the time bound: the current config stays" if final else ""))
    since = start
    gain = _gain(samples, since, until, canary, time_scale)
    step = (until - since) / PARTS
    parts = [_gain(samples, since + i * step, since + (i + 1) * step, canary, time_scale)
             for i in range(PARTS)]
    values = [g for g in parts if g is not None]
    noise = (statistics.stdev(values) / len(values) ** 0.5) if len(values) >= 2 else None
    over, why = turned_over(samples, since, until)
    if gain is None:
        return Verdict("keep" if final else "wait", None, noise, over, "no rate to compare")
    surely_better = noise is not None and gain - SIGMAS * noise >= bar
    surely_short = noise is not None and gain + SIGMAS * noise < bar
    spread = f"gain {gain:.2f} ± {noise:.2f}" if noise is not None else f"gain {gain:.2f}"
    if over and surely_better:
        return Verdict("better", gain, noise, over, f"{spread}: clears {bar:g}")
    if over and surely_short:
        return Verdict("keep", gain, noise, over, f"{spread}: short of {bar:g}")
    if final:
        return Verdict("keep", gain, noise, over,
                       f"{spread} undecided at the time bound ({why}): the current config stays")
    return Verdict("wait", gain, noise, over, f"{spread}; {why}")
