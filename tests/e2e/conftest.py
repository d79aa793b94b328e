"""Every end-to-end test's finished outputs account for every input row.

After each test, each output folder it left under its tmp_path whose plan is fully committed
(`plan.json`, every shard in `manifest.jsonl`) is read back: every shard's answers plus its
error rows hold each of the shard's input ids exactly `n` times (n samples a prompt, the same
for every id), and the manifest's counts say the same. A row refused before sending, one
that killed a server, a 4xx: each must leave an error row, never a gap.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from infra.manifest import Manifest
from infra.prompts import iter_rows


@pytest.fixture(autouse=True)
def every_row_accounted_for(tmp_path: Path) -> Iterator[None]:
    yield
    for plan in tmp_path.rglob("plan.json"):
        check_output(plan.parent)


def check_output(out: Path) -> None:
    manifest = Manifest(out)
    try:
        plan = manifest.load_plan()
        committed = manifest.committed()
    except (OSError, ValueError):
        return
    source = Path(plan.input_path)
    if len(committed) < plan.num_shards or not source.is_file():
        return  # unfinished (a test that stops a run on purpose), or its input is gone
    samples: set[int] = set()
    for shard, entry in sorted(committed.items()):
        start, stop = plan.rows_of(shard)
        wanted = Counter(str(r["id"]) for r in iter_rows(source, start, stop,
                                                         id_dtype=plan.id_dtype))
        got = Counter(ids_in(out / entry.path))
        if entry.error_path:
            got += Counter(ids_in(out / entry.error_path))
        n = next(iter(got.values()), 1) // max(1, next(iter(wanted.values()), 1))
        samples.add(n)
        assert got == Counter({i: c * n for i, c in wanted.items()}), (
            f"{out}: shard {shard}: answers + error rows {sum(got.values())} do not hold its "
            f"{stop - start} input rows × {n} (missing {sorted(set(wanted) - set(got))[:5]})")
        assert entry.rows + entry.errors == (stop - start) * n, json.dumps(entry.__dict__)
    assert len(samples) <= 1, f"{out}: shards answered different sample counts {samples}"


def ids_in(path: Path) -> list[str]:
    return [str(i) for i in pl.read_parquet(path, columns=["id"])["id"].to_list()]
