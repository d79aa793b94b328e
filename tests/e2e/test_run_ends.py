"""Every way a run ends in failure ends with one `error:` block (tasks/run_ends.py,
expansion/failure_report.py) and loses nothing: a disk that fills mid-run, a bucket that
stops answering mid-run, servers whose relaunches fail to start. Each then resumes with the
same command once the cause is gone, every id exactly once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import boto3
import httpx
import polars as pl
import pytest

from tests.conftest import free_port_block

ROOT = Path(__file__).resolve().parents[2]
EXPANSION = str(ROOT / ".venv" / "bin" / "expansion")


def prompts(tmp_path: Path, rows: int, pad: int = 0) -> Path:
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"id": f"i{i}", "prompt": f"note {i} " + "x" * pad})
                           + "\n" for i in range(rows)))
    return src


def error_block(output: str) -> list[str]:
    lines = output.rstrip().splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("error: "))
    return lines[start:]


def committed_ids(out: Path) -> list[str]:
    ids: list[str] = []
    for entry in (json.loads(line) for line in (out / "manifest.jsonl").read_text()
                  .splitlines()):
        ids += pl.read_parquet(out / entry["path"])["id"].to_list()
    return ids


def user_namespaces_work() -> bool:
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"],
                          capture_output=True)
    return done.returncode == 0


@pytest.mark.slow
def test_a_disk_that_fills_mid_run_ends_in_one_block_and_resumes_once_freed(
        tmp_path: Path, prefect_env: dict[str, str]) -> None:
    """The output folder is a 120 KiB tmpfs (in a user+mount namespace of the test's own):
    the fifth shard does not fit. After it is grown the same command finishes the job."""
    if shutil.which("unshare") is None or not user_namespaces_work():
        pytest.skip("this box allows no user+mount namespace to mount a small disk in")
    src, out, copy = prompts(tmp_path, 400, pad=50), tmp_path / "out", tmp_path / "copy"
    out.mkdir()
    run = (f"{EXPANSION} run --prompts {src} --output {out} --gpus 0 --set shard_size=20 "
           f"--set sim.startup_s=0.2 --set sim.time_scale=500 --set tuning.enabled=false "
           f"--set base_port={free_port_block(1)}")
    script = tmp_path / "go.sh"
    script.write_text(f"mount -t tmpfs -o size=120k none {out}\n{run} 2>{tmp_path}/first.err"
                      f"\necho $? > {tmp_path}/first.rc\n"
                      f"mount -o remount,size=8m {out}\n{run} 2>{tmp_path}/second.err\n"
                      f"echo $? > {tmp_path}/second.rc\ncp -r {out} {copy}\n")
    env = {**os.environ, **prefect_env}
    subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "bash", str(script)],
                   env=env, cwd=ROOT, capture_output=True, timeout=300, check=True)
    first = (tmp_path / "first.err").read_text()
    block = error_block(first)
    assert (tmp_path / "first.rc").read_text().strip() == "1", first[-3000:]
    assert len(block) <= 12 and block[0].startswith(
        "error: the output's disk refused a write: writing shard "), block
    assert "[Errno 28] No space left on device" in block[0], block
    assert block[1].startswith("  disk: ") and "free of 120.0 KiB" in block[1], block
    assert any(line.startswith("  safe: ") and "nothing lost" in line for line in block), block
    assert block[-1].startswith("  advice: make room on that disk"), block
    second = (tmp_path / "second.err").read_text()
    assert (tmp_path / "second.rc").read_text().strip() == "0", second[-3000:]
    ids = committed_ids(copy)
    assert sorted(ids) == sorted(f"i{i}" for i in range(400))  # each exactly once
    assert not list((copy / "shards").glob(".*.tmp"))  # no half-written shard left


def moto(port: int) -> subprocess.Popen[bytes]:
    """A real S3 server (moto's server mode) of this test's own, to stop mid-run."""
    exe = Path(sys.executable).parent / "moto_server"
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}", timeout=1)
            return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("moto_server did not start")


def remote_shards(s3: object, bucket: str) -> list[dict]:
    try:
        body = s3.get_object(Bucket=bucket, Key="job/manifest.jsonl")["Body"].read()  # type: ignore[attr-defined]
    except Exception:  # not published yet, or the server is down
        return []
    return [json.loads(line) for line in body.decode().splitlines()]


@pytest.mark.slow
def test_a_bucket_that_stops_answering_mid_run_ends_in_one_block_and_uploads_on_resume(
        tmp_path: Path, prefect_env: dict[str, str]) -> None:
    """The bucket goes away after two shards reached it: generation goes on, every shard is
    committed locally, the final upload fails after its tries and says so; with the bucket
    back, the same command uploads everything and generates nothing again."""
    port = free_port_block(1)
    endpoint = f"http://127.0.0.1:{port}"
    env = {**os.environ, **prefect_env, "EXPANSION_STORAGE__ENDPOINT_URL": endpoint,
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    src, out = prompts(tmp_path, 400), tmp_path / "out"
    args = [EXPANSION, "run", "--prompts", str(src), "--output", str(out), "--upload-to",
            "s3://run-ends/job", "--gpus", "0,1", "--set", "shard_size=25", "--set",
            "sim.startup_s=0.2", "--set", "sim.time_scale=10", "--max-new-tokens", "32", "--set",
            f"base_port={free_port_block(2)}", "--set", "storage.upload_retry_delays_s=[0.5]"]
    server = moto(port)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    try:
        s3.create_bucket(Bucket="run-ends")
        run = subprocess.Popen(args, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 180
        while len(remote_shards(s3, "run-ends")) < 2:
            assert run.poll() is None and time.monotonic() < deadline, "no shard reached S3"
            time.sleep(0.1)
        server.terminate()
        server.wait(timeout=10)
        _, err = run.communicate(timeout=300)
        block = error_block(err)
        assert run.returncode == 1 and len(block) <= 12, err[-3000:]
        assert block[0].startswith("error: the bucket could not be reached: "), block
        assert "(after 2 tries)" in block[0], block
        assert block[-2] == f"  safe: 16 shard(s) committed in {out}; 0 pending, nothing lost"
        assert block[-1].startswith("  advice: check storage.endpoint_url"), block
        assert sorted(committed_ids(out)) == sorted(f"i{i}" for i in range(400))
        server = moto(port)  # back, and empty: the resume uploads all of it
        s3.create_bucket(Bucket="run-ends")
        again = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True,
                               timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
        assert sorted(e["shard"] for e in remote_shards(s3, "run-ends")) == list(range(16))
        assert "prompts: 0 done this run (0 errors, 400 committed before)" in again.stdout, (
            again.stdout[-2000:])
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.slow
def test_servers_whose_relaunches_fail_to_start_end_in_one_block(
        tmp_path: Path, prefect_env: dict[str, str]) -> None:
    """Both servers die after 10 answers and their GPUs refuse every restart (a GPU an Xid
    error left unusable): each is relaunched at most twice, then the run ends with the
    crash, the relaunches' own failure, and advice about the host, not the rows."""
    src, out = prompts(tmp_path, 600), tmp_path / "out"
    faults = {"crash_after_requests": 10, "fail_restart": "error",
              "start_marker_dir": str(tmp_path / "markers")}
    started = time.monotonic()
    done = subprocess.run(
        [EXPANSION, "run", "--prompts", str(src), "--output", str(out), "--gpus", "0,1",
         "--set", "shard_size=20", "--set", "sim.startup_s=0.2", "--set",
         f"base_port={free_port_block(2)}", "--set", f"sim.faults={json.dumps(faults)}"],
        env={**os.environ, **prefect_env}, cwd=ROOT, capture_output=True, text=True,
        timeout=300)
    block = error_block(done.stderr)
    assert done.returncode == 1 and len(block) <= 12, done.stderr[-3000:]
    assert time.monotonic() - started < 120
    assert block[0].startswith("error: the fleet went down: all 2 servers stopped answering")
    said = "\n".join(block)
    assert "simulated crash (fault injection)" in said, block
    assert "relaunch.log: SGLang said" in said, block
    assert "RuntimeError: simulated startup failure (fault injection)" in said, block
    assert block[-1].startswith("  advice: the servers died mid-run and their relaunches "
                                "failed to start"), block
    relaunches = sorted(p.name for p in (out / "servers").glob("*.relaunch.log"))
    assert relaunches == ["server-0-gpu0.relaunch.log", "server-1-gpu1.relaunch.log"]
    assert not list(out.glob("errors/*.parquet"))  # no row blamed
