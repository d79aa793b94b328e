"""The workload the input fixes, and the demand the tuner predicts with before any commit."""

from __future__ import annotations

import json
from pathlib import Path

from flows.job import RunTotals
from infra.input_lengths import InputLengths, sample_lengths


def write_rows(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def token_rows(n: int) -> list[dict[str, object]]:
    """Prompts of 100..199 tokens; one row in a hundred asks for 4,000 tokens, the rest 500."""
    return [{"id": i, "input_ids": [5] * (100 + i % 100),
             "max_new_tokens": 4000 if i % 100 == 99 else 500} for i in range(n)]


def test_token_rows_under_ignore_eos_fix_prompt_and_output_lengths(tmp_path: Path) -> None:
    path = write_rows(tmp_path / "p.jsonl", token_rows(1000))
    lengths = sample_lengths(path, 1000, "Int64", 256, ignore_eos=True)
    assert lengths.rows_sampled == 1000
    assert lengths.prompt_tokens == 150  # mean of 100..199, rounded
    assert lengths.output_tokens == 535  # (99 × 500 + 4,000) / 100
    assert lengths.output_p99 == 4000


def test_without_ignore_eos_the_rows_fix_no_output_length(tmp_path: Path) -> None:
    path = write_rows(tmp_path / "p.jsonl", token_rows(200))
    lengths = sample_lengths(path, 200, "Int64", 256, ignore_eos=False)
    assert lengths.prompt_tokens == 150
    assert lengths.output_tokens is None and lengths.output_p99 is None


def test_text_prompts_leave_the_prompt_length_to_the_commits(tmp_path: Path) -> None:
    rows = [{"id": i, "prompt": "word " * 50} for i in range(50)]
    lengths = sample_lengths(write_rows(tmp_path / "p.jsonl", rows), 50, "Int64", 300,
                             ignore_eos=True)
    assert lengths.prompt_tokens is None
    assert (lengths.output_tokens, lengths.output_p99) == (300, None)  # the job's default


def test_a_large_file_is_sampled_in_blocks_spread_over_it(tmp_path: Path) -> None:
    """Sorted by length, the first rows alone would read 100-token prompts only."""
    rows = [{"id": i, "input_ids": [5] * (100 if i < 5000 else 900)} for i in range(10_000)]
    lengths = sample_lengths(write_rows(tmp_path / "p.jsonl", rows), 10_000, "Int64", 64,
                             ignore_eos=True, sample=400)
    assert lengths.rows_sampled == 400
    assert lengths.prompt_tokens == 500  # two blocks of each


def test_the_first_decision_predicts_the_committed_rate_for_the_rows_own_lengths(
        tmp_path: Path) -> None:
    totals = RunTotals()
    assert totals.demand(2048).workload is None  # nothing known: the decode rate
    path = write_rows(tmp_path / "p.jsonl", token_rows(1000))
    totals.input_lengths = sample_lengths(path, 1000, "Int64", 256, ignore_eos=True)
    workload = totals.demand(2048).workload
    assert workload is not None
    # to two significant figures, so that repeated checks hit the predictor's cache
    assert (workload.prompt_tokens, workload.output_tokens, workload.output_p99) == (150, 540,
                                                                                     4000)
    # once shards commit, their uncached prompt tokens replace the input's (the cache counts)
    totals.done, totals.tokens, totals.prompt_tokens, totals.cached_tokens = 10, 5350, 1500, 1000
    workload = totals.demand(2048).workload
    assert workload is not None and workload.prompt_tokens == 50
    assert workload.output_tokens == 540  # still the rows' own: exact under ignore_eos


def test_text_rows_without_ignore_eos_predict_from_commits_only() -> None:
    totals = RunTotals()
    totals.done, totals.tokens, totals.prompt_tokens = 4, 4000, 800
    workload = totals.demand(2048).workload
    assert workload is not None
    assert (workload.prompt_tokens, workload.output_tokens, workload.output_p99) == (200, 1000,
                                                                                     None)
    # long answers still running: the servers' tokens per answer finished, when longer
    live = totals.demand(2048, generated_per_finished=1733.0).workload
    assert live is not None and live.output_tokens == 1700
    assert totals.demand(2048, generated_per_finished=400.0).workload == workload
    # no answer is longer than max_new_tokens, however many long ones are still in flight
    capped = totals.demand(2048, generated_per_finished=3300.0, max_new_tokens=2048).workload
    assert capped is not None and capped.output_tokens == 2000  # 2,048 to two figures
    # ... unless rows set their own max_new_tokens: the job's then bounds nothing
    totals.input_lengths = InputLengths(100, None, None, None, rows_set_max_new_tokens=True)
    own = totals.demand(2048, generated_per_finished=3300.0, max_new_tokens=2048).workload
    assert own is not None and own.output_tokens == 3300
