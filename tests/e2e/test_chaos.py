"""Exactly once under SIGKILL: kill the generating process at moments set by what it has done
(while its servers start, the instant after a shard commits, mid-generation), resume each time.

The run goes through the real CLI and a real Prefect server, with servers as real processes
and uploads to a real S3 endpoint. At the end every id appears exactly once, locally and in
the bucket, and the completions equal an uninterrupted run's (the simulator is deterministic
per row: the clean run answers a sample of the rows).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import boto3
import polars as pl
import pytest

from infra.manifest import Manifest
from tests.conftest import free_port_block

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = 3000
SAMPLE = 300  # rows the clean run answers: completions are a function of the row alone
LIFE_S = 120  # a life that reaches none of its events in this time fails the test


def cli_args(out: str, src: Path, s3: str | None, time_scale: float) -> list[str]:
    args = [sys.executable, "-m", "expansion.cli", "run", "--prompts", str(src),
            "--output", out, "--gpus", "0,1", "--shard-size", "100", "--max-new-tokens", "24",
            "--time-scale", str(time_scale), "--set", f"base_port={free_port_block(2)}",
            "--set", "sim.startup_s=0.1", "--set", "stop_grace_s=3"]
    return args + (["--upload-to", s3] if s3 else [])


def run_to_end(out: str, src: Path, env: dict[str, str], s3: str | None) -> None:
    proc = subprocess.run(cli_args(out, src, s3, 400), cwd=ROOT, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]


def life_until(out: str, src: Path, env: dict[str, str], s3: str,
               event: Callable[[], bool], delay_s: float = 0.0) -> bool:
    """Run the CLI until `event()` holds, wait `delay_s`, SIGKILL it; False if it finished
    first (the job was done)."""
    proc = subprocess.Popen(cli_args(out, src, s3, 2.0), cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = time.monotonic()
    while not event():
        if proc.poll() is not None:
            return False
        assert time.monotonic() - started < LIFE_S, "the event never came"
        time.sleep(0.05)
    time.sleep(delay_s)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # the dead owner's lease stays (infra/lease.py): the next life takes it over, its pid gone
    assert (Path(out) / "lease.json").exists()
    return True


def committed_rows(out: str) -> int:
    if not Path(out, "plan.json").exists():
        return 0
    return sum(e.rows + e.errors for e in Manifest(Path(out)).committed().values())


def server_log_bytes(out: str) -> int:
    return sum(f.stat().st_size for f in Path(out, "servers").glob("*.log")) \
        if Path(out, "servers").is_dir() else 0


def kill_events(out: str) -> list[tuple[str, Callable[[], Callable[[], bool]], float]]:
    """The moments of the six kills: (name, a factory of the event read at the life's start,
    seconds after it). Each factory snapshots the folder, so "a shard committed" means one
    more than when this life began."""
    def shard_committed() -> Callable[[], bool]:
        before = committed_rows(out)
        return lambda: committed_rows(out) > before

    def servers_starting() -> Callable[[], bool]:
        before = server_log_bytes(out)
        return lambda: server_log_bytes(out) > before

    return [("after the first commit", shard_committed, 0.3),
            ("as its servers start", servers_starting, 0.0),
            ("the instant a shard commits", shard_committed, 0.0),
            ("mid-generation", shard_committed, 0.7),
            ("as its servers start", servers_starting, 0.2),
            ("the instant a shard commits", shard_committed, 0.0)]


@pytest.mark.slow  # not in the prefect_server group: the longest test runs beside it
def test_sigkill_at_six_moments_loses_and_duplicates_nothing(
        prefect_env: dict[str, str], s3_endpoint: str, bucket: str,
        tmp_path: Path) -> None:
    src = tmp_path / "prompts.jsonl"
    rows = [{"id": f"c{i:05d}", "prompt": f"chaos prompt {i}"} for i in range(PROMPTS)]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {**os.environ, **prefect_env, "EXPANSION_STORAGE__ENDPOINT_URL": s3_endpoint}
    chaos_out = str(tmp_path / "chaos")
    target = f"s3://{bucket}/chaos"
    progress = []
    for name, event, delay_s in kill_events(chaos_out):
        assert life_until(chaos_out, src, env, target, event(), delay_s), \
            f"the run finished before the kill {name!r}"
        progress.append(committed_rows(chaos_out))
    run_to_end(chaos_out, src, env, target)
    assert progress[0] > 0 and progress[-1] > progress[0], progress

    chaos = Manifest(Path(chaos_out)).read_completions()
    assert chaos.height == PROMPTS and chaos["id"].n_unique() == PROMPTS

    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    remote_ids: list[str] = []
    manifest = s3.get_object(Bucket=bucket, Key="chaos/manifest.jsonl")["Body"].read()
    for line in manifest.decode().splitlines():
        entry = json.loads(line)
        body = s3.get_object(Bucket=bucket, Key=f"chaos/{entry['path']}")["Body"].read()
        remote_ids += pl.read_parquet(body)["id"].to_list()
    assert len(remote_ids) == PROMPTS and len(set(remote_ids)) == PROMPTS

    sample = random.Random(1234).sample(rows, SAMPLE)
    clean_src = tmp_path / "sample.jsonl"
    clean_src.write_text("".join(json.dumps(r) + "\n" for r in sample))
    clean_out = str(tmp_path / "clean")
    run_to_end(clean_out, clean_src, env, None)
    clean = Manifest(Path(clean_out)).read_completions()
    cols = ["id", "completion", "finish_reason", "completion_tokens"]
    picked = chaos.filter(pl.col("id").is_in([r["id"] for r in sample]))
    assert clean.height == SAMPLE
    assert picked.sort("id").select(cols).equals(clean.sort("id").select(cols))
