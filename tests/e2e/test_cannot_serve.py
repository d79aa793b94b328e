"""A fleet that cannot serve stops in one screen, in SGLang's own words (tasks/first_batch.py,
expansion/failure_report.py): every prompt kills the server that schedules it, as a broken
build or an unsupported kernel backend would. The run relaunches each dead server at most
once, blames no row, and ends with the `error:` block quoting the simulated SGLang's crash;
a second identical run says the same without relaunching."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import free_port_block

ROOT = Path(__file__).resolve().parents[2]
EXPANSION = str(ROOT / ".venv" / "bin" / "expansion")
CRASH = "CUDA error: an illegal memory access was encountered (fault injection: crash_on_text)"


def run_once(args: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str],
                                                              float]:
    started = time.monotonic()
    done = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    return done, time.monotonic() - started


def job(tmp_path: Path, prompt: str, rows: int,
        prefect_env: dict[str, str]) -> tuple[dict[str, str], Path, Path]:
    """The environment of a CLI run on the test run's Prefect server, its prompts, its
    output."""
    env = {**os.environ, **prefect_env}
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"id": f"i{i}", "prompt": prompt.format(i)}) + "\n"
                           for i in range(rows)))
    return env, src, tmp_path / "out"


def error_block(output: str) -> list[str]:
    lines = output.rstrip().splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("error: "))
    return lines[start:]


@pytest.mark.slow
def test_a_fleet_whose_every_batch_dies_stops_with_sglangs_words(
        tmp_path: Path, prefect_env: dict[str, str]) -> None:
    env, src, out = job(tmp_path, "note {}: POISON", 200, prefect_env)
    args = [EXPANSION, "run", "--prompts", str(src), "--output", str(out), "--gpus", "0,1",
            "--set", f"base_port={free_port_block(2)}", "--set", "sim.startup_s=0.2",
            "--set", 'sim.faults={"crash_on_text": "POISON"}']
    first, took = run_once(args, env)
    assert first.returncode != 0 and took < 60, (took, first.stderr[-3000:])
    block = error_block(first.stdout + first.stderr)
    assert len(block) <= 12 and block == error_block(first.stderr), block
    # (on a loaded box the dispatcher can see both servers gone before a relaunch is up)
    assert block[0].startswith("error: the fleet cannot serve: every server died on its "
                               "first batch"), block
    assert any(CRASH in line for line in block) and "advice:" in block[-1], block
    assert any("0 shard(s) committed" in line for line in block), block
    record = json.loads((out / "servers" / "cannot-serve.json").read_text())
    assert all(1 <= n <= 2 for n in record["deaths"].values()), record  # ≤ 1 relaunch each
    assert "killed the server" not in first.stdout + first.stderr  # no row blamed
    assert not (out / "errors").exists() or not any((out / "errors").iterdir())
    relaunch_logs = relaunch_log_times(out)  # the first run may have relaunched none
    second, _ = run_once(args, env)
    block = error_block(second.stderr)
    assert second.returncode != 0 and len(block) <= 12, second.stderr[-3000:]
    assert block[0].startswith("error: the fleet cannot serve: every server died on its "
                               "first batch (server-0 1×, server-1 1×)"), block
    assert relaunch_log_times(out) == relaunch_logs  # the second run relaunched none


def relaunch_log_times(out: Path) -> dict[str, int]:
    """Each relaunch log of the output and when it was last written: a relaunch writes one."""
    return {log.name: log.stat().st_mtime_ns
            for log in (out / "servers").glob("*.relaunch.log")}


@pytest.mark.slow
def test_a_server_that_fails_to_start_ends_with_the_same_block(
        tmp_path: Path, prefect_env: dict[str, str]) -> None:
    env, src, out = job(tmp_path, "note {}", 50, prefect_env)
    done, _ = run_once([EXPANSION, "run", "--prompts", str(src), "--output", str(out),
                        "--gpus", "0", "--set", f"base_port={free_port_block(1)}",
                        "--set", "server.mem_fraction_static=0.05"], env)
    block = error_block(done.stderr)
    assert done.returncode == 1 and len(block) <= 12, done.stderr[-3000:]
    assert block[0].startswith("error: a server failed to start: server 0 (GPU 0"), block
    assert any("ValueError: mem_fraction_static=0.050 leaves no memory for pools" in line
               for line in block), block
    assert block[-1].startswith("  advice: fix what SGLang names above"), block


@pytest.mark.slow
def test_a_fleet_that_goes_down_mid_run_ends_with_the_same_block(
        tmp_path: Path, prefect_env: dict[str, str]) -> None:
    """Every server dies after 10 answers, relaunched ones too: the fleet served, so it is
    down, not unable to serve — the block says so, quotes the crash and keeps what was
    committed."""
    env, src, out = job(tmp_path, "note {}", 600, prefect_env)
    done, _ = run_once([EXPANSION, "run", "--prompts", str(src), "--output", str(out),
                        "--gpus", "0,1", "--set", f"base_port={free_port_block(2)}",
                        "--set", "sim.startup_s=0.2", "--set", "shard_size=20",
                        "--set", 'sim.faults={"crash_after_requests": 10}'], env)
    block = error_block(done.stderr)
    assert done.returncode == 1 and len(block) <= 12, done.stderr[-3000:]
    assert block[0].startswith("error: the fleet went down: all 2 servers stopped answering"), (
        block)
    assert any("simulated crash (fault injection)" in line for line in block), block
    assert any(line.startswith("  safe: ") and "pending, nothing lost" in line
               for line in block), block
    assert not (out / "servers" / "cannot-serve.json").exists()
