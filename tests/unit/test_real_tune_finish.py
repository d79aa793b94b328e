"""The tuner's whole run from the 35B-A3B's default flags on real SGLang 0.5.17 (H200, dummy
weights; bench/real_sglang/data/2026-12-05-h200-s22): `device.sh warm35`, then `device.sh
tune 10000 530` (cut by the call's bound after 19 of 40 shards, in epoch 2) and at once the
same command again, which resumed on the move and finished. Nothing here was fitted on."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tasks.tuning.ledger import TuningLedger

DATA = Path(__file__).resolve().parents[2] / "bench/real_sglang/data/2026-12-05-h200-s22"
SWEEP_BEST = 4809.0  # the 35B's five-server sweep: bf16 + graphs (test_real_unseen.py)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("tune35")
    with tarfile.open(DATA / "tune35-output.tar.gz") as tar:
        tar.extractall(where, filter="data")
    return where / "tune35"


def shards(run: Path) -> list[dict[str, Any]]:
    entries = [json.loads(line) for line in (run / "manifest.jsonl").read_text().splitlines()]
    return sorted(entries, key=lambda e: e["committed_at"])


def epoch_rate(entries: list[dict[str, Any]]) -> float:
    """Committed tok/s from one epoch's shards (the first opens the window)."""
    return (sum(e["output_tokens"] for e in entries[1:])
            / (entries[-1]["committed_at"] - entries[0]["committed_at"]))


def test_every_row_once_on_two_configurations() -> None:
    rows = json.loads((DATA / "tune35-resume-rows.json").read_text())
    assert rows["rows"] == rows["unique_ids"] == 10_000
    assert sorted(c["len"] for c in rows["by_config"]) == [500, 9_500]


def test_the_resume_ran_on_the_move_and_kept_it(run: Path) -> None:
    first, moved, resumed = TuningLedger(run / "tuning.jsonl").entries()
    assert (first.epoch, first.outcome) == (1, "measured")
    assert (moved.epoch, moved.outcome) == (2, "started")  # the first call's bound cut it
    assert (resumed.epoch, resumed.fingerprint) == (3, moved.fingerprint)
    log = (DATA / "tune35-resume.log").read_text()
    assert "resuming on the configuration this job moved to in epoch 2" in log
    assert "epoch 3 kept its config" in log


def test_the_tuner_ends_within_5_percent_of_the_sweeps_best_never_below_its_start(
        run: Path) -> None:
    entries = shards(run)
    epoch2 = [e for e in entries if 2 <= e["shard"] <= 18]
    epoch3 = [e for e in entries if e["shard"] >= 19]
    first = TuningLedger(run / "tuning.jsonl").entries()[0]
    for rate in (epoch_rate(epoch2), epoch_rate(epoch3)):
        assert rate >= 0.95 * SWEEP_BEST
        assert rate > (first.tok_s_per_gpu or 0.0)  # above what the default measured
