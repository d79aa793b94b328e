"""Two runs on one output folder, or on one bucket prefix from two staging folders (the way two
hosts share it) (infra/lease.py, infra/bucket_lease.py): the second refuses in one line naming
the first, which finishes unharmed with every id exactly once. A folder whose owner was
SIGKILLed is taken over by the next run: tests/e2e/test_chaos.py does so six times in a row
(and checks the dead owner's lease is left behind); a lease whose owner is gone on this host
or lapsed on another is tests/unit/test_lease.py's."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import boto3
import polars as pl
import pytest

from infra.manifest import Manifest
from tests.conftest import free_port_block

ROOT = Path(__file__).resolve().parents[2]
EXPANSION = str(ROOT / ".venv" / "bin" / "expansion")
ROWS = 800


def args(src: Path, out: Path, target: str, time_scale: float = 4.0) -> list[str]:
    return [EXPANSION, "run", "--prompts", str(src), "--output", str(out), "--gpus", "0,1",
            "--upload-to", target, "--shard-size", "100", "--max-new-tokens", "32",
            "--time-scale", str(time_scale), "--set", "sim.startup_s=0.2",
            "--set", f"base_port={free_port_block(2)}", "--set", "stop_grace_s=3"]


def refused(cmd: list[str], env: dict[str, str], what: str) -> str:
    """Run a second run that must refuse before anything starts; its one line."""
    second = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert second.returncode == 2, second.stderr[-3000:]
    said = second.stderr.strip().splitlines()
    assert len(said) == 1 and said[0].startswith(f"error: output: {what} is in use by a live "
                                                 "run (flow run '"), said
    assert said[0].endswith("or pass --force-takeover if you know that run is dead"), said
    return said[0]


def wait_for_commits(out: Path, proc: subprocess.Popen[Any], shards: int) -> None:
    deadline = time.monotonic() + 180
    while True:
        try:
            if len(Manifest(out).committed()) >= shards:
                return
        except (OSError, ValueError):
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "no shard committed"
        time.sleep(0.1)


def every_id_once(out: Path) -> list[str]:
    ids: list[str] = []
    for line in (out / "manifest.jsonl").read_text().splitlines():
        ids += pl.read_parquet(out / json.loads(line)["path"])["id"].to_list()
    return sorted(ids)


@pytest.mark.slow
def test_a_second_run_on_a_live_runs_output_or_bucket_refuses_naming_it(
        tmp_path: Path, prefect_env: dict[str, str], s3_endpoint: str, bucket: str) -> None:
    src, out = tmp_path / "p.jsonl", tmp_path / "out"
    src.write_text("".join(json.dumps({"id": f"i{i:04d}", "prompt": f"lease {i}"}) + "\n"
                           for i in range(ROWS)))
    env = {**os.environ, **prefect_env, "EXPANSION_STORAGE__ENDPOINT_URL": s3_endpoint}
    target = f"s3://{bucket}/job"
    # the first run at a quarter of the usual pace: it must still be live when the others
    # (fresh interpreters importing Prefect, seconds on a loaded box) read the leases
    first = subprocess.Popen(args(src, out, target, time_scale=1.0), env=env, cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    wait_for_commits(out, first, 1)
    same_folder = refused(args(src, out, target), env, str(out))
    assert f"pid {first.pid} on " in same_folder
    # another staging folder (another host's) publishing to the same prefix: the bucket says
    other_host = refused(args(src, tmp_path / "elsewhere", target), env,
                         f"{target}/lease.json")
    assert f"pid {first.pid} on " in other_host
    assert not (tmp_path / "elsewhere" / "lease.json").exists()  # took nothing
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]  # unharmed: its servers were never touched
    assert every_id_once(out) == sorted(f"i{i:04d}" for i in range(ROWS))
    assert not (out / "lease.json").exists()  # released at its end, the bucket's too
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert "job/manifest.jsonl" in keys and "job/lease.json" not in keys
