"""The bucket is the record: a run SIGKILLed mid-way whose local folder is then deleted
resumes on the bucket alone, keeps every shard the bucket holds, and ends with every
(id, sample) exactly once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import polars as pl
import pytest

from tests.conftest import free_port_block

ROOT = Path(__file__).resolve().parents[2]
PROMPTS, SHARD, SAMPLES = 600, 50, 2


def cli(src: Path, out: Path, target: str, env: dict[str, str],
        time_scale: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "expansion.cli", "run", "--prompts", str(src), "--output",
         str(out), "--upload-to", target, "--gpus", "0,1", "--shard-size", str(SHARD),
         "--max-new-tokens", "24", "--time-scale", str(time_scale),
         "--set", f"base_port={free_port_block(2)}",
         "--set", "sim.startup_s=0.1", "--set", "stop_grace_s=3", "--set",
         f"sampling.n={SAMPLES}", "--set", "tuning.enabled=false"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def remote_manifest(s3: object, bucket: str) -> list[dict]:
    try:
        answer = s3.get_object(Bucket=bucket, Key="job/manifest.jsonl")  # type: ignore[attr-defined]
        body = answer["Body"].read()
    except Exception:  # not published yet
        return []
    return [json.loads(line) for line in body.decode().splitlines()]


@pytest.mark.slow
def test_resume_from_the_bucket_alone(prefect_env: dict[str, str], s3_endpoint: str, bucket: str,
                                      tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": i, "prompt": f"resume {i}"}) + "\n"
                           for i in range(PROMPTS)))
    env = {**os.environ, **prefect_env}
    env["EXPANSION_STORAGE__ENDPOINT_URL"] = s3_endpoint
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    out, target = tmp_path / "node-a", f"s3://{bucket}/job"
    first = cli(src, out, target, env, time_scale=1.0)
    deadline = time.monotonic() + 300
    while len(remote_manifest(s3, bucket)) < 3:
        assert first.poll() is None, (first.stdout.read() if first.stdout else b"").decode()
        assert time.monotonic() < deadline, "nothing reached the bucket"
        time.sleep(0.2)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    kept = {e["shard"]: e["sha256"] for e in remote_manifest(s3, bucket)}
    assert len(kept) < PROMPTS // SHARD, "the run finished before the kill"
    shutil.rmtree(out)  # the node is gone: only the bucket is left

    second = cli(src, tmp_path / "node-b", target, env, time_scale=50.0)
    log, _ = second.communicate(timeout=600)
    assert second.returncode == 0, log.decode()[-3000:]
    assert f"restored {len(kept)} committed shards" in log.decode()
    final = remote_manifest(s3, bucket)
    by_shard = {e["shard"]: e for e in final}
    assert sorted(by_shard) == list(range(PROMPTS // SHARD)) and len(final) == len(by_shard)
    assert all(by_shard[s]["sha256"] == digest for s, digest in kept.items())  # not redone
    ids: list[tuple[int, int]] = []
    for entry in final:
        body = s3.get_object(Bucket=bucket, Key=f"job/{entry['path']}")["Body"].read()
        frame = pl.read_parquet(body)
        ids += list(zip(frame["id"].to_list(), frame["sample_index"].to_list(), strict=True))
    assert len(ids) == PROMPTS * SAMPLES and len(set(ids)) == len(ids)
