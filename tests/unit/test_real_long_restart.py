"""A restart cycle on long, mixed outputs, through the pipeline on real SGLang 0.5.17 (H200):
measured against predicted (bench/real_sglang/data/2026-12-02-h200-s9/e2elong/ and, the same
rows on session 14's predictor, -s14/e2elong/; both from `device.sh e2elong 400`:
job_27b_long.toml, the Qwen3.6-27B text shapes with dummy weights).

400 token-id rows of 128–1,024 prompt tokens, each with its own max_new_tokens drawn lognormal
(mean 800, p99 4,000, at most 4,096) under ignore_eos. The job started from the seeds'
extra_buffer config (mamba ratio 0.3: cap 23, mamba-bound); the tuner scored its moves with the
committed rate for the lengths the rows fix (infra/input_lengths.py) and restarted once.

"Real" steady rates are the server's own: SGLang's decode log lines (`gen throughput`, tokens
generated per second over each 20 steps, prefill time included) while its queue was not empty,
so the cap was full — what the predictor predicts. At the cap every generated token is
committed: this run retracted nothing."""

from __future__ import annotations

import gzip
import json
import re
import statistics
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from infra.input_lengths import InputLengths
from infra.sglang.flags import ServerFlags
from infra.sglang.memory import plan_memory
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.versions import parse_version
from infra.sim.predict import Workload, committed_tok_s

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "bench" / "real_sglang" / "data"
SESSIONS = [RUNS / "2026-12-02-h200-s9" / "e2elong",  # the first, with session 9's predictor
            RUNS / "2026-12-02-h200-s14" / "e2elong"]  # the same rows on session 14's
MODEL = model_profile(str(ROOT / "tests" / "fixtures" / "models" / "qwen3.6-27b-text"), 50.16)
H200 = gpu_profile("h200")
V0517 = parse_version("0.5.17")
DECODE = re.compile(r"Decode batch, #running-req: (\d+).*gen throughput \(token/s\): ([\d.]+), "
                    r"#queue-req: (\d+)")


@cache
def ledger(data: Path) -> list[dict[str, Any]]:
    lines = (data / "tuning.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def flags_of(data: Path, epoch: int) -> ServerFlags:
    entry = next(e for e in ledger(data) if e["epoch"] == epoch)
    return ServerFlags(**{k: v for k, v in entry["flags"].items() if k != "extra_args"})


def steady_rate(data: Path, log: str) -> tuple[float, int]:
    """Mean `gen throughput` of the decode lines while requests queued (the first line of
    such a stretch covers the prefill of the whole batch: left out), and the running count."""
    text = gzip.decompress((data / log).read_bytes()).decode()
    at_cap = [(int(m[1]), float(m[2])) for m in DECODE.finditer(text) if int(m[3]) > 0]
    return statistics.mean(r for _, r in at_cap[1:]), max(n for n, _ in at_cap)


def workload(data: Path) -> Workload:
    """The lengths the rows fix, as the flow computed them (its log line says 588 / 761 /
    3,525): recomputed from the request list the device's make_prompts.py wrote."""
    rows = json.loads((data / "requests.json").read_text())
    outs = sorted(o for _, o in rows)
    lengths = InputLengths(len(rows), round(sum(p for p, _ in rows) / len(rows)),
                           round(sum(outs) / len(outs)), outs[int(0.99 * len(outs))])
    assert "588-token prompts, 761 out (p99 3,525)" in (data / "e2elong.log").read_text()
    assert lengths.describe() == "588-token prompts, 761 out (p99 3,525)"
    assert lengths.prompt_tokens and lengths.output_tokens
    return Workload(lengths.prompt_tokens, lengths.output_tokens, lengths.output_p99)


@pytest.mark.parametrize("data", SESSIONS, ids=lambda d: d.parent.name)
def test_every_row_once_and_one_restart_to_no_buffer(data: Path) -> None:
    manifest = [json.loads(x) for x in (data / "manifest.jsonl").read_text().splitlines()]
    assert sum(e["rows"] for e in manifest) == 400 and sum(e["errors"] for e in manifest) == 0
    assert len({e["shard"] for e in manifest}) == 20
    assert sum(e["output_tokens"] for e in manifest) == 304_347  # every row to its length
    assert json.loads((data / "e2elong-rows.json").read_text())["unique_ids"] == 400
    before, after = flags_of(data, 1), flags_of(data, 2)
    assert (before.mamba_strategy, after.mamba_strategy) == ("extra_buffer", "no_buffer")
    caps = [plan_memory(MODEL, H200, f, V0517).max_running_requests for f in (before, after)]
    assert caps == [23, 122]
    logs = ("server-0-gpu0.log.gz", "server-0-gpu0.epoch2.log.gz")
    assert [steady_rate(data, log)[1] for log in logs] == caps


@pytest.mark.parametrize("data", SESSIONS, ids=lambda d: d.parent.name)
def test_the_tuner_predicted_with_the_committed_rate_of_the_rows_own_lengths(data: Path) -> None:
    """The ledger's prediction for the new config is the predictor's figure for this
    workload: the one the decision used (its log: 'committed rate for 588-token prompts' in
    session 9; 590 / 760, the committed rows' own, in session 14)."""
    predicted = committed_tok_s(MODEL, H200, flags_of(data, 2), V0517, workload(data))
    assert ledger(data)[1]["predicted_tok_s_per_gpu"] == pytest.approx(predicted, rel=0.01)
    said = {"2026-12-02-h200-s9": "committed rate for 588-token prompts, 761 out",
            "2026-12-02-h200-s14": "committed rate for 590-token prompts, 760 out"}
    assert said[data.parent.name] in (data / "e2elong.log").read_text()


@pytest.mark.parametrize("data", SESSIONS, ids=lambda d: d.parent.name)
@pytest.mark.parametrize(("epoch", "log"), [(1, "server-0-gpu0.log.gz"),
                                            (2, "server-0-gpu0.epoch2.log.gz")])
def test_each_config_commits_what_was_predicted_within_10_percent(data: Path, epoch: int,
                                                                  log: str) -> None:
    """Real (steady, at the cap): 1,105.7 tok/s before, 2,841.9 after (session 9);
    1,097.2 and 2,784.9 (session 14, predicted 2,781)."""
    real, _ = steady_rate(data, log)
    predicted = committed_tok_s(MODEL, H200, flags_of(data, epoch), V0517, workload(data))
    assert predicted == pytest.approx(real, rel=0.10)


@pytest.mark.parametrize("data", SESSIONS, ids=lambda d: d.parent.name)
def test_the_move_gained_what_was_predicted_within_10_percent(data: Path) -> None:
    """Real 2.57× (session 9), 2.54× (session 14); predicted 2.44× (the decode-only
    roofline: 2.67×)."""
    real = (steady_rate(data, "server-0-gpu0.epoch2.log.gz")[0]
            / steady_rate(data, "server-0-gpu0.log.gz")[0])
    w = workload(data)
    predicted = (committed_tok_s(MODEL, H200, flags_of(data, 2), V0517, w)
                 / committed_tok_s(MODEL, H200, flags_of(data, 1), V0517, w))
    assert predicted == pytest.approx(real, rel=0.10)
