"""What a run's commits say about its workload: tokens, rows, errors, prompt and cached
tokens, the answers' lengths. Counted from commits (what the manifest holds), not from
answers, so a shard cut short by a restart and redone is not counted twice; the tuner reads
its predictions' workload from here (`demand`, `prefix_reuse`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infra.input_lengths import InputLengths
from infra.sglang.planner import Demand
from infra.sim.predict import Workload
from tasks.tuning.answer_lengths import AnswerLengths
from tasks.tuning.policy import PrefixReuse


@dataclass
class RunTotals:
    """Counted from commits (what the manifest holds), not from answers: a shard cut short by
    a restart is redone, and its first answers are not counted twice."""

    tokens: int = 0
    done: int = 0
    errors: int = 0
    answers: int = 0  # every answer received, including those of shards redone after a drain
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the servers' prefix caches reused
    # prefix affinity primes groups on no_buffer servers (text or token-id prompts, affinity
    # on: tasks/affinity.py), so a move there keeps the reuse
    primes_groups: bool = False
    primers: int = 0  # primers sent (no_buffer servers)
    # Wall seconds the fleets took to come up, and spent generating (every epoch summed):
    # what a start-up costs beside the rate the servers held while they worked.
    startup_s: float = 0.0
    generating_s: float = 0.0
    input_lengths: InputLengths | None = None  # what the rows fix (infra/input_lengths.py)
    answer_lengths: AnswerLengths = field(default_factory=AnswerLengths)  # committed, sampled

    def prefix_reuse(self) -> PrefixReuse | None:
        return PrefixReuse.measured(self.prompt_tokens, self.cached_tokens, self.tokens,
                                    self.primes_groups)

    def demand(self, avg_context: float, generated_per_finished: float | None = None,
               max_new_tokens: int | None = None) -> Demand:
        """The job's own workload, to predict committed rates: the prompt's uncached tokens as
        committed so far, else as the token-id rows give them; the output's lengths as the
        rows fix them (ignore_eos: mean and p99 of their max_new_tokens), else the servers'
        tokens generated per request finished (`generated_per_finished`: the committed mean
        reads short while long answers run), else as committed so far. With either unknown
        (text rows before the first commit), the decode rate. Text rows' p99: the committed
        answers' (tasks/tuning/answer_lengths.py). No answer is longer than
        `max_new_tokens` (the job's, unless rows set their own): early in a job, with few
        requests finished and many long ones in flight, tokens per finished request can read
        past it (the canary scenarios' early overestimate, #26)."""
        fixed = self.input_lengths
        prompt = (max(1, round((self.prompt_tokens - self.cached_tokens) / self.done))
                  if self.done > 0 and self.prompt_tokens > 0
                  else fixed.prompt_tokens if fixed else None)
        if fixed is not None and fixed.output_tokens is not None:
            output, p99 = fixed.output_tokens, fixed.output_p99
        elif self.done > 0 and self.tokens > 0:
            committed_mean = self.tokens / self.done
            own = fixed is not None and fixed.rows_set_max_new_tokens
            longest = float(max_new_tokens) if max_new_tokens and not own else float("inf")
            output = max(1, round(min(longest, max(committed_mean,
                                                   generated_per_finished or 0.0))))
            tail = self.answer_lengths.p99(output)
            if tail is None:  # too few answers to see their spread: no move scored yet
                return Demand(avg_context)
            p99 = round(min(longest, tail))
        else:
            return Demand(avg_context)
        if prompt is None:
            return Demand(avg_context)
        # to two significant figures: a replay per candidate costs seconds, and a workload
        # that moves by a token with every commit would miss the predictor's cache each check
        p99 = _two_figures(p99) if p99 is not None else None
        output = _two_figures(output)
        return Demand(avg_context, Workload(_two_figures(prompt), output,
                                            p99 if p99 is not None and p99 > output else None))


def _two_figures(n: int) -> int:
    return max(1, int(float(f"{n:.2g}")))
