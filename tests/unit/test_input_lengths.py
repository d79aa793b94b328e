"""The workload the input fixes, and the demand the tuner predicts with before any commit."""

from __future__ import annotations

import json
from pathlib import Path

from infra.input_lengths import InputLengths, sample_lengths
from tasks.totals import RunTotals


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
    assert totals.demand(2048).workload is None  # too few answers to see their spread
    totals.answer_lengths.add([1000] * 100)  # all alike: no tail
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


def test_text_rows_predict_with_the_answers_tail() -> None:
    """A p99 goes to the predictor (a mean alone made a cap that fills its KV with the long
    answers look safe: #26): lognormal through the mean and the committed answers' median."""
    totals = RunTotals()
    lengths = [200] * 60 + [1000] * 30 + [4000] * 10  # median 200, mean 820
    totals.answer_lengths.add(lengths)
    totals.done, totals.tokens, totals.prompt_tokens = 100, sum(lengths), 20_000
    workload = totals.demand(2048).workload
    assert workload is not None
    # sigma = sqrt(2 ln(820 / 200)) = 1.680; p99 = 200 * exp(2.326 * 1.680) = 9,907 → 2 figures
    assert (workload.output_tokens, workload.output_p99) == (820, 10_000)
    # while long answers run, the servers read a longer mean: a wider tail
    live = totals.demand(2048, generated_per_finished=1640.0).workload
    assert live is not None and live.output_tokens == 1600
    assert live.output_p99 is not None and live.output_p99 > 10_000
    # and never past max_new_tokens
    capped = totals.demand(2048, generated_per_finished=1640.0, max_new_tokens=6000).workload
    assert capped is not None and capped.output_p99 == 6000


def test_the_tail_of_a_reasoning_models_answers_is_read_from_the_short_ones() -> None:
    """Lognormal answers (mean 2,000, p99 16,000), of which only the shortest 60 % have come
    back (mean 560): with the servers' mean the p99 comes out near the job's, not near the
    longest answer finished; alike answers get no tail; and the sample is uniform and
    bounded however long the job."""
    import math
    import random

    from tasks.tuning.answer_lengths import MIN_SAMPLE, SAMPLE_SIZE, AnswerLengths

    rng = random.Random(1)
    answers = sorted(round(rng.lognormvariate(math.log(964), 1.208)) for _ in range(20_000))
    early = AnswerLengths()
    early.add(answers[:12_000])
    assert 14_000 < (early.p99(1700.0) or 0) < 20_000
    alike = AnswerLengths()
    alike.add([100] * (MIN_SAMPLE - 1))
    assert alike.p99(100) is None  # too few to tell
    alike.add([100])
    assert alike.p99(100) == 100
    stream = AnswerLengths()
    stream.add(range(1, 50_001))
    assert len(stream._sample) == SAMPLE_SIZE
    assert abs((stream.p99(0.0) or 0) - 25_000) < 1_500  # the whole stream's median, no tail


def test_a_cap_is_sized_by_the_answers_the_running_set_holds() -> None:
    """The running set is the long answers (a request seen running is one in proportion to
    its length): mean 2,000, p99 16,000 holds 4,300 tokens of output a request, half way
    through a length-biased draw, where the mean said 2,000; alike answers as before."""
    from infra.sim.predict import Workload

    assert Workload(500, 2000).kv_per_request() == 2500
    tail = Workload(500, 2000, 16_000).kv_per_request()
    assert 4_500 < tail < 5_000
