"""The parser against every scheduler line each SGLang release since 0.2 can print.

The corpus (tests/fixtures/sglang-log-corpus/lines.jsonl) is rendered from each release's own
source by bench/sglang_log_corpus.py: a line carries every field its release prints there, with
made-up values the parser must read back. A release that prints a field the parser drops, or
reads wrong, shows up here by name.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from infra.sglang.observe import RECORD_KEYS, parse_log_line

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from sglang_log_corpus import LABEL_FIELDS, LABEL_SCALE, NOT_READ  # noqa: E402

CORPUS = [json.loads(line) for line in
          (ROOT / "tests" / "fixtures" / "sglang-log-corpus" / "lines.jsonl").open()]
RELEASES = sorted({ln["release"] for ln in CORPUS})


def _misread(line: dict) -> tuple[int, list[str]]:
    record = parse_log_line(line["line"]) or {}
    wrong, fields = [], 0
    for label, printed in line["fields"].items():
        key = LABEL_FIELDS.get(label)
        if key is None:
            continue
        fields += 1
        want = printed * LABEL_SCALE.get(label, 1)
        got = record.get(key)
        if got is None or abs(float(got) - float(want)) > 1e-9 * max(1.0, abs(float(want))):
            wrong.append(f"{label}: printed {printed}, read {got}")
    return fields, wrong


def test_the_corpus_spans_the_releases_and_every_line_kind() -> None:
    assert {"0.2.0", "0.3.0", "0.4.0", "0.4.10", "0.5.2", "0.5.17", "0.5.23"} <= set(RELEASES)
    kinds = Counter((ln["release"], ln["kind"]) for ln in CORPUS)
    for release in RELEASES:
        assert kinds[(release, "decode")] and kinds[(release, "prefill")], release


def test_every_label_maps_to_a_record_key_or_is_named_as_not_read() -> None:
    assert set(LABEL_FIELDS.values()) <= set(RECORD_KEYS)
    for line in CORPUS:
        for label in line["fields"]:
            assert label in LABEL_FIELDS or label in NOT_READ, (line["release"], label)


@pytest.mark.parametrize("release", RELEASES)
def test_each_release_parses_at_99_5_percent_of_fields(release: str) -> None:
    lines = [ln for ln in CORPUS if ln["release"] == release]
    fields, wrong = 0, []
    for line in lines:
        n, bad = _misread(line)
        fields += n
        wrong += [f"{line['kind']} {b}" for b in bad]
    assert fields >= 6
    assert (fields - len(wrong)) / fields >= 0.995, wrong


def test_the_whole_corpus_reads_every_field() -> None:
    total = [_misread(ln) for ln in CORPUS]
    fields = sum(n for n, _ in total)
    wrong = [w for _, bad in total for w in bad]
    assert fields > 800 and not wrong, wrong[:10]
