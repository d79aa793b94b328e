"""The `generate` flow end to end: Prefect, two simulated servers as processes, real files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from infra.manifest import Manifest
from infra.processes import port_is_free
from tests.conftest import free_port_block

ROOT = Path(__file__).resolve().parents[2]


def prompts(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"id-{i:04d}", "prompt": f"question {i}"}) + "\n"
                            for i in range(n)))
    return path


def overrides(**extra: object) -> dict[str, Any]:
    return {"base_port": free_port_block(2), "sim.startup_s": 0.2, "sim.time_scale": 500.0,
            "sampling.max_new_tokens": 32, "shard_size": 50, "stop_grace_s": 5.0, **extra}


@pytest.mark.slow
def test_every_prompt_has_exactly_one_completion(prefect_api: None, tmp_path: Path) -> None:
    from flows.generate import generate

    src = prompts(tmp_path / "p.jsonl", 300)
    out = tmp_path / "out"
    opts = overrides(upload_to=str(tmp_path / "bucket"))
    summary = generate(prompts=str(src), output=str(out), gpus=[0, 1], overrides=opts)
    assert summary["prompts_done_this_run"] == 300
    assert len(summary["servers"]) == 2
    assert all(s["max_running_requests"] > 0 for s in summary["servers"])
    frame = Manifest(out).read_completions()
    assert frame.height == 300
    assert frame["id"].n_unique() == 300
    assert set(frame["id"]) == {f"id-{i:04d}" for i in range(300)}
    assert {"completion", "finish_reason", "prompt_tokens", "completion_tokens", "server",
            "config", "latency_s", "prompt"} <= set(frame.columns)
    assert set(frame["server"]) == {"server-0", "server-1"}
    for port in (opts["base_port"], opts["base_port"] + 1):
        assert port_is_free("127.0.0.1", port)
    uploaded = sorted((tmp_path / "bucket" / "shards").glob("*.parquet"))
    assert len(uploaded) == 6 and (tmp_path / "bucket" / "manifest.jsonl").is_file()
    # The bucket is the run's record too: report, tuning ledger, time series, server logs.
    bucket = tmp_path / "bucket"
    assert (bucket / "report.md").is_file() and (bucket / "report.png").is_file()
    assert (bucket / "tuning.jsonl").is_file() and list((bucket / "monitor").glob("*.parquet"))
    assert sorted(p.name for p in (bucket / "servers").glob("*.log")) == [
        "server-0-gpu0.log", "server-1-gpu1.log"]

    again = generate(prompts=str(src), output=str(out), gpus=[0, 1], overrides=overrides())
    assert again["prompts_done_this_run"] == 0 and again["already_committed"] == 300
    assert again["servers"] == []  # nothing pending: no GPU time spent


@pytest.mark.slow
def test_resume_after_partial_output_completes_the_rest(prefect_api: None,
                                                        tmp_path: Path) -> None:
    from flows.generate import generate

    src = prompts(tmp_path / "p.jsonl", 200)
    out = tmp_path / "out"
    generate(prompts=str(src), output=str(out), gpus=[0], overrides=overrides())
    manifest = Manifest(out)
    full = manifest.read_completions().sort("id")
    # Drop two committed shards from the ledger as if they had never been committed.
    lines = manifest.manifest_path.read_text().splitlines(keepends=True)
    manifest.manifest_path.write_text("".join(lines[:2]))
    summary = generate(prompts=str(src), output=str(out), gpus=[0, 1], overrides=overrides())
    assert summary["prompts_done_this_run"] == 100
    resumed = manifest.read_completions().sort("id")
    assert resumed["id"].to_list() == full["id"].to_list()
    assert resumed["completion"].to_list() == full["completion"].to_list()


def test_cli_dry_run_prints_one_launch_line_per_gpu() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "expansion.cli", "run", "--dry-run", "--gpus", "0,1,2",
         "--mamba-strategy", "no_buffer", "--set", "api_key=topsecret"],
        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 3
    assert all("--mamba-radix-cache-strategy no_buffer" in line for line in lines)
    assert "topsecret" not in proc.stdout
    assert "warning" not in proc.stderr  # the default base_port is below the ephemeral range


def test_cli_set_of_a_top_level_field_is_the_same_as_its_option() -> None:
    """`--set engine=sglang` once broke with "got multiple values for keyword 'engine'"."""
    proc = subprocess.run(
        [sys.executable, "-m", "expansion.cli", "run", "--dry-run", "--set", "engine=sglang",
         "--set", "gpus=[0, 1]", "--set", "model=/models/x", "--set", "python=/opt/py"],
        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert "sglang_version" in proc.stderr and "Traceback" not in proc.stderr  # not here
    proc = subprocess.run(
        [sys.executable, "-m", "expansion.cli", "run", "--dry-run", "--set", "engine=sglang",
         "--set", "gpus=[0, 1]", "--set", "model=/models/x", "--set", "python=/opt/py",
         "--set", "sglang_version=0.5.17"],
        capture_output=True, text=True, cwd=ROOT, timeout=120)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 2 and all("/opt/py -m sglang.launch_server --model-path /models/x"
                                   in line for line in lines)


def test_cli_set_null_overrides_the_config_file(tmp_path: Path) -> None:
    """`--set server.mamba_full_memory_ratio=null` once left the file's 0.3 in place."""
    job = tmp_path / "job.toml"
    job.write_text('[server]\nmamba_full_memory_ratio = 0.3\n')
    base = [sys.executable, "-m", "expansion.cli", "run", "--dry-run", "--config", str(job)]
    kept = subprocess.run(base, capture_output=True, text=True, cwd=ROOT, timeout=120)
    reset = subprocess.run([*base, "--set", "server.mamba_full_memory_ratio=null"],
                           capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert kept.returncode == reset.returncode == 0, kept.stderr + reset.stderr
    assert "--mamba-full-memory-ratio 0.3" in kept.stdout
    assert "--mamba-full-memory-ratio" not in reset.stdout


def test_cli_warns_about_server_ports_in_the_ephemeral_range() -> None:
    from infra.processes import ephemeral_port_range

    span = ephemeral_port_range()
    if span is None:
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range here")
    proc = subprocess.run(
        [sys.executable, "-m", "expansion.cli", "run", "--dry-run", "--gpus", "0,1",
         "--set", f"base_port={span[0]}"],
        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "warning: base_port: server port(s)" in " ".join(proc.stderr.split())


def test_cli_bad_setting_is_one_clear_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "expansion.cli", "run", "--mem-fraction-static", "1.5"],
        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert "server.mem_fraction_static" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bundled_sample_has_500_plus_prompts() -> None:
    frame = pl.read_ndjson(ROOT / "flows" / "data" / "sample_prompts.jsonl")
    assert frame.height >= 500 and frame["id"].n_unique() == frame.height


@pytest.mark.slow
def test_output_straight_to_s3(prefect_api: None, tmp_path: Path, s3_endpoint: str,
                               bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    from flows.generate import generate

    monkeypatch.chdir(tmp_path)  # the staging copy lands under ./expansion-staging
    src = prompts(tmp_path / "p.jsonl", 120)
    summary = generate(prompts=str(src), output=f"s3://{bucket}/jobs/a", gpus=[0],
                       overrides=overrides(**{"storage.endpoint_url": s3_endpoint}))
    assert summary["output"] == f"s3://{bucket}/jobs/a"
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    manifest = s3.get_object(Bucket=bucket, Key="jobs/a/manifest.jsonl")["Body"].read()
    entries = [json.loads(line) for line in manifest.decode().splitlines()]
    assert sum(e["rows"] for e in entries) == 120
    for e in entries:
        head = s3.head_object(Bucket=bucket, Key=f"jobs/a/{e['path']}")
        assert head["Metadata"]["sha256"] == e["sha256"]
    assert (tmp_path / "expansion-staging" / bucket / "jobs" / "a" / "plan.json").is_file()


@pytest.mark.slow
def test_three_servers_on_one_gpu(prefect_api: None, tmp_path: Path) -> None:
    from flows.generate import generate

    src = prompts(tmp_path / "p.jsonl", 150)
    summary = generate(prompts=str(src), output=str(tmp_path / "out"), gpus=[0],
                       overrides=overrides(servers_per_gpu=3, base_port=free_port_block(3)))
    assert summary["prompts_done_this_run"] == 150
    assert len(summary["servers"]) == 3
    served = pl.read_parquet(tmp_path / "out" / "shards" / "*.parquet")["server"].unique()
    assert sorted(served.to_list()) == ["server-0", "server-1", "server-2"]
