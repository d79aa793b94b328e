"""What the input itself says of each request's length, read before any answer comes back.

The tuner scores a move by the committed rate for the job's own workload (infra/sim/predict.py).
Committed shards give that workload only after the first ones finish, and with long, mixed
outputs the first to finish are the short ones. Some of it is known from the rows themselves:
a pre-tokenized prompt's length exactly, and under `ignore_eos` every answer's length (each
runs to its `max_new_tokens`, the row's or the job's). A sample of rows spread over the file
gives their mean and 99th percentile; text and chat prompts are not tokenized here, so their
length stays unknown until commits measure it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from infra.prompts import iter_rows

SAMPLE_BLOCKS = 4  # blocks spread over the file, so a file sorted by length is not misread
SAMPLE_ROWS = 4000


@dataclass(frozen=True)
class InputLengths:
    """Token lengths the rows fix; None where the input does not fix them."""

    rows_sampled: int
    prompt_tokens: int | None  # mean over the sample (token-id rows only)
    output_tokens: int | None  # mean (ignore_eos only)
    output_p99: int | None  # None: every sampled output the same length
    # Some sampled row sets its own max_new_tokens: the job's is then no bound on an answer.
    rows_set_max_new_tokens: bool = False

    def describe(self) -> str:
        parts = []
        if self.prompt_tokens is not None:
            parts.append(f"{self.prompt_tokens:,}-token prompts")
        if self.output_tokens is not None:
            spread = f" (p99 {self.output_p99:,})" if self.output_p99 else ""
            parts.append(f"{self.output_tokens:,} out{spread}")
        return ", ".join(parts) or "nothing"


def sample_lengths(path: Path, rows: int, id_dtype: str, default_max_new_tokens: int,
                   ignore_eos: bool, sample: int = SAMPLE_ROWS) -> InputLengths:
    """Mean prompt and output lengths of up to `sample` rows taken in SAMPLE_BLOCKS blocks."""
    if rows <= sample:
        block, starts = rows, [0]
    else:
        block = sample // SAMPLE_BLOCKS
        starts = [i * rows // SAMPLE_BLOCKS for i in range(SAMPLE_BLOCKS)]
    prompts: list[int] = []
    outputs: list[int] = []
    own_max = False
    for start in starts:
        for row in iter_rows(path, start, min(rows, start + block), id_dtype=id_dtype):
            ids = row.get("input_ids")
            if isinstance(ids, list):
                prompts.append(len(ids))
            wanted = row.get("max_new_tokens")
            own_max = own_max or wanted is not None
            outputs.append(int(str(wanted)) if wanted is not None else default_max_new_tokens)
    n = len(outputs)
    prompt = round(sum(prompts) / len(prompts)) if prompts and len(prompts) == n else None
    if not ignore_eos or not outputs:
        return InputLengths(n, prompt, None, None, own_max)
    mean = max(1, round(sum(outputs) / n))
    p99 = sorted(outputs)[min(n - 1, int(0.99 * n))]
    return InputLengths(n, prompt, mean, p99 if p99 > mean else None, own_max)
