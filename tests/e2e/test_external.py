"""engine = "external": servers someone else runs (here a simulated fleet started apart from
the job, as a Kubernetes deployment or a Slurm job would be). The job measures, monitors,
diagnoses and writes every prompt once; it never stops or restarts them, and the tuner's move
comes back as advice (tasks/tuning/advice.py)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from infra.manifest import Manifest

# The seeds' mamba-bound start (extra_buffer on the 27B FP8 shapes), as in test_tuning.py.
SERVERS = {"model": "qwen3.6-27b-fp8", "sim.gpu": "rtx-pro-6000", "sim.time_scale": 20.0,
           "server.mamba_strategy": "extra_buffer", "sampling.max_new_tokens": 1024}


@pytest.mark.slow
@pytest.mark.xdist_group("tuning")
def test_external_servers_answer_every_prompt_once_stay_up_and_get_advice(
        prefect_api: None, sim_fleet, tmp_path: Path) -> None:
    from flows.generate import generate

    handles = sim_fleet(2, **SERVERS)
    src = tmp_path / "p.jsonl"
    n = 600
    src.write_text("".join(json.dumps({"id": f"x{i:05d}", "prompt": f"ext {i}"}) + "\n"
                           for i in range(n)))
    out = tmp_path / "job"
    summary = generate(prompts=str(src), output=str(out), engine="external", overrides={
        "server_urls": ",".join(h.url for h in handles), "model": SERVERS["model"],
        "server.mamba_strategy": "extra_buffer", "sampling.max_new_tokens": 1024,
        "shard_size": 50, "tuning.window_s": 4.0, "tuning.sample_interval_s": 0.5,
        "tuning.restart_payback": 1.0})
    frame = Manifest(out).read_completions()
    assert frame.height == n and frame["id"].n_unique() == n  # every prompt, once
    assert {r["server"] for r in frame.select("server").to_dicts()} == {"server-0", "server-1"}
    for h in handles:  # still up: the job never stopped them
        assert httpx.get(f"{h.url}/health", timeout=5).status_code == 200
        assert h.record.pid > 0
    assert summary["restarts"] == 0 and summary["cycles"] == []
    [advice] = summary["advice"]
    assert advice["diagnosis"] == "mamba-bound", advice
    assert advice["predicted_gain"] > 1.5
    assert "--mamba-radix-cache-strategy" in advice["launch_flags"] or (
        "--mamba-full-memory-ratio" in advice["launch_flags"]), advice
    assert not list((out / "servers").glob("*.log"))  # no server of its own
