"""Exactly once under SIGKILL: kill the generating process at random moments, resume each time.

The run goes through the real CLI and a real Prefect server, with servers as real processes
and uploads to a real S3 endpoint. At the end every id appears exactly once, locally and in
the bucket, and the completions equal an uninterrupted run's (the simulator is deterministic).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import polars as pl
import pytest

from infra.ledger import Ledger
from tests.conftest import free_port_block

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = 5000
KILLS = 6


def run_cli(out: str, src: Path, env: dict[str, str], port: int, s3: str | None,
            kill_after: float | None, time_scale: float = 2.0) -> int | None:
    args = [sys.executable, "-m", "expansion.cli", "run", "--prompts", str(src),
            "--output", out, "--gpus", "0,1", "--shard-size", "100", "--max-new-tokens", "24",
            "--time-scale", str(time_scale), "--set", f"base_port={port}",
            "--set", "sim.startup_s=0.1", "--set", "stop_grace_s=3"]
    if s3:
        args += ["--upload-to", s3]
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    if kill_after is None:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode()[-3000:]
        return proc.returncode
    try:
        proc.wait(timeout=kill_after)
        return proc.returncode  # finished before the kill
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


def committed_rows(out: str) -> int:
    if not Path(out, "plan.json").exists():
        return 0
    return sum(e.rows + e.errors for e in Ledger(Path(out)).committed().values())


def seconds_to_first_commit(out: str, src: Path, env: dict[str, str], s3: str) -> float:
    """Run the CLI until its first shard is committed, then SIGKILL it (the first kill)."""
    args = [sys.executable, "-m", "expansion.cli", "run", "--prompts", str(src),
            "--output", out, "--gpus", "0,1", "--shard-size", "100", "--max-new-tokens", "24",
            "--time-scale", "2", "--set", f"base_port={free_port_block(2)}",
            "--set", "sim.startup_s=0.1", "--set", "stop_grace_s=3", "--upload-to", s3]
    started = time.monotonic()
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    while committed_rows(out) == 0:
        assert proc.poll() is None and time.monotonic() - started < 180, "no first commit"
        time.sleep(0.1)
    took = time.monotonic() - started
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return took


@pytest.mark.slow  # not in the prefect_server group: the longest test runs beside it
def test_sigkill_at_random_moments_loses_and_duplicates_nothing(
        prefect_env: dict[str, str], s3_endpoint: str, bucket: str,
        tmp_path: Path) -> None:
    src = tmp_path / "prompts.jsonl"
    src.write_text("".join(json.dumps({"id": f"c{i:05d}", "prompt": f"chaos prompt {i}"}) + "\n"
                           for i in range(PROMPTS)))
    env = {**os.environ, **prefect_env, "EXPANSION_STORAGE__ENDPOINT_URL": s3_endpoint}
    rng = random.Random(1234)
    chaos_out = str(tmp_path / "chaos")
    target = f"s3://{bucket}/chaos"
    # Kill moments scale with how long this machine takes to commit a first shard (CLI and
    # Prefect start-up, server launch, one shard): from half of that (still starting) to
    # 1.4 times it (mid-generation), so the test means the same on a slow or a fast box.
    first_commit_s = seconds_to_first_commit(chaos_out, src, env, target)
    kills = 1
    progress = [committed_rows(chaos_out)]
    while kills < KILLS:
        code = run_cli(chaos_out, src, env, free_port_block(2), target,
                       kill_after=rng.uniform(0.5, 1.4) * first_commit_s)
        if code is not None:
            break  # it finished between two kills
        kills += 1
        progress.append(committed_rows(chaos_out))
    run_cli(chaos_out, src, env, free_port_block(2), target, kill_after=None, time_scale=400)
    assert kills == KILLS, f"only {kills} kills landed before the run finished"
    assert progress[-1] > progress[0], "no shard was committed between kills"

    chaos = Ledger(Path(chaos_out)).read_completions()
    assert chaos.height == PROMPTS and chaos["id"].n_unique() == PROMPTS

    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    remote_ids: list[str] = []
    manifest = s3.get_object(Bucket=bucket, Key="chaos/manifest.jsonl")["Body"].read()
    for line in manifest.decode().splitlines():
        entry = json.loads(line)
        body = s3.get_object(Bucket=bucket, Key=f"chaos/{entry['path']}")["Body"].read()
        remote_ids += pl.read_parquet(body)["id"].to_list()
    assert len(remote_ids) == PROMPTS and len(set(remote_ids)) == PROMPTS

    clean_out = str(tmp_path / "clean")
    run_cli(clean_out, src, env, free_port_block(2), None, kill_after=None, time_scale=400)
    clean = Ledger(Path(clean_out)).read_completions()
    cols = ["id", "completion", "finish_reason", "completion_tokens"]
    assert chaos.sort("id").select(cols).equals(clean.sort("id").select(cols))
    time.sleep(0.1)
