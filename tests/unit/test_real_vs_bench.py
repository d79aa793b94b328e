"""The pipeline against SGLang's own benchmark on real SGLang 0.5.17 on the H200 (#29 item 3).

Session 13, `device.sh vsbench` (bench/real_sglang/vs_bench.py), one device call per model:
`python -m sglang.benchmark.serving` (random-ids, token ids, `--max-concurrency C`) against a
server launched from the job's own TOML, then the same prompts through `expansion run` with
`client.concurrency_per_server = C` and tuning off, on a fresh server with the same argv.
Data: bench/real_sglang/data/2026-12-02-h200-s13/vsbench-*/. These tests hold the recorded
figures to the logs they came from, and the pipeline's prompts to the benchmark's draws.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "bench" / "real_sglang" / "data" / "2026-12-02-h200-s13"
sys.path.insert(0, str(ROOT / "bench" / "real_sglang"))
from vs_bench import bench_rows  # noqa: E402

RUNS = {  # name → (rows, input len, output len, range ratio, concurrency) as device.sh ran it
    "tiny": (20000, 128, 32, 1.0, 256),
    "q27": (256, 1024, 1024, 0.125, 96),
}


@cache
def recorded(name: str) -> dict[str, Any]:
    folder = DATA / f"vsbench-{name}"
    return {
        "line": json.loads((folder / f"vs-{name}.json").read_text()),
        "bench": json.loads((folder / "bench.jsonl").read_text().splitlines()[-1]),
        "summary": json.loads((folder / "pipeline-summary.json").read_text()),
        "bench_log": (folder / "bench.log").read_text(),
        "pipeline_log": (folder / "pipeline.log").read_text(),
    }


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_pipeline_commits_at_least_98_percent_of_what_the_benchmark_gets(name: str) -> None:
    rec = recorded(name)
    bench_tok_s = rec["bench"]["output_throughput"]
    pipeline_tok_s = rec["summary"]["output_tokens"] / rec["summary"]["generating_s"]
    assert rec["line"]["ratio"] == pytest.approx(pipeline_tok_s / bench_tok_s, abs=1e-3)
    assert pipeline_tok_s / bench_tok_s >= 0.98


@pytest.mark.parametrize("name", sorted(RUNS))
def test_both_ran_the_same_prompts_answers_and_concurrency(name: str) -> None:
    rows, input_len, output_len, ratio, conc = RUNS[name]
    rec = recorded(name)
    drawn = bench_rows(rows, input_len, output_len, ratio, vocab=1024, seed=42)
    assert rec["bench"]["completed"] == rows == rec["summary"]["prompts_done_this_run"]
    assert rec["summary"]["errors_this_run"] == 0
    assert rec["bench"]["total_input_tokens"] == sum(len(r["input_ids"]) for r in drawn)
    assert rec["bench"]["total_output_tokens"] == sum(r["max_new_tokens"] for r in drawn)
    assert rec["summary"]["output_tokens"] == rec["bench"]["total_output_tokens"]
    assert rec["bench"]["max_concurrency"] == conc == rec["summary"]["client_concurrency"]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_figures_are_the_ones_the_logs_print(name: str) -> None:
    rec = recorded(name)
    printed = re.search(r"Output token throughput \(tok/s\):\s+([\d.]+)", rec["bench_log"])
    assert printed and float(printed[1]) == pytest.approx(rec["bench"]["output_throughput"],
                                                          abs=0.01)
    generating = re.search(r"([\d.]+) s generating = ([\d,.]+) tok/s while generating",
                           rec["pipeline_log"])
    assert generating and float(generating[1]) == pytest.approx(rec["summary"]["generating_s"],
                                                                abs=0.05)
    assert float(generating[2].replace(",", "")) == rec["line"]["pipeline_output_tok_s"]


def _server_args(log: str) -> dict[str, str]:
    line = next(raw for raw in log.splitlines() if "server_args=ServerArgs(" in raw)
    return dict(re.findall(r"(\w+)=('[^']*'|[^,()]+)", line))


def test_the_27b_benchmark_and_the_pipeline_ran_the_same_server() -> None:
    """The same launch flags (vs_bench.py builds the benchmark's server with the pipeline's
    own launcher); only the run-specific names may differ."""
    folder = DATA / "vsbench-q27"
    bench = _server_args(gzip.decompress((folder / "bench-server.log.gz").read_bytes())
                         .decode(errors="replace"))
    pipeline = _server_args(gzip.decompress((folder / "pipeline-server.log.gz").read_bytes())
                            .decode(errors="replace"))
    differs = {k for k in bench.keys() | pipeline.keys() if bench.get(k) != pipeline.get(k)}
    assert differs <= {"random_seed", "port", "nccl_port", "file_storage_path",
                       "crash_dump_folder"}, {k: (bench.get(k), pipeline.get(k)) for k in differs}
    assert bench["max_running_requests"] in ("None", "82")
