"""`expansion plan` and `expansion inspect` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from infra.sglang.observe import RECORD_KEYS
from tests.conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "expansion.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


def test_plan_json_pins_seed_004() -> None:
    proc = cli("plan", "--model", "Qwen/Qwen3.6-27B", "--gpu", "b200", "--sglang-version",
               "main", "--mamba-radix-cache-strategy", "extra_buffer",
               "--max-mamba-cache-size", "80", "--speculative-algorithm", "EAGLE",
               "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["mamba_slots"] == 80
    assert data["ssm_state_gib"] == 11.39 and data["intermediate_gib"] == 9.56
    assert data["max_running_requests"] == 16 and data["binding_limit"] == "mamba"
    for key in ("conv_state_gib", "kv_cache_gib", "max_total_num_tokens"):
        assert key in data
    labels = [a["label"] for a in data["alternatives"]]
    assert "no_buffer" in labels and "MTP off" in labels
    no_buffer = next(a for a in data["alternatives"] if a["label"] == "no_buffer")
    assert no_buffer["max_running_requests"] > 16


def test_plan_table_names_the_binding_pool() -> None:
    proc = cli("plan", "--model", "qwen3.6-27b-fp8", "--gpu", "rtx-pro-6000")
    assert proc.returncode == 0, proc.stderr
    assert "binds: mamba" in proc.stdout and "no_buffer" in proc.stdout


def test_plan_dense_model_is_not_mamba_bound() -> None:
    data = json.loads(cli("plan", "--model", "qwen3-32b", "--gpu", "h100", "--json").stdout)
    assert data["mamba_slots"] == 0 and data["binding_limit"] != "mamba"


def test_plan_refusal_and_bad_flag_are_one_line() -> None:
    proc = cli("plan", "--mem-fraction-static", "0.4")
    assert proc.returncode == 1 and "refuse to start" in proc.stderr
    proc = cli("plan", "--mem-fraction-static", "1.4")
    assert proc.returncode == 2 and "--mem-fraction-static" in proc.stderr
    proc = cli("plan", "--gpu", "tpu")
    assert proc.returncode == 2 and "unknown GPU profile" in proc.stderr


def test_inspect_json_records_have_the_documented_keys() -> None:
    proc = cli("inspect", str(FIXTURES / "sglang-samples" / "logs.txt"), "--json")
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert records and all(len(r) == len(RECORD_KEYS) == 34 for r in records)
    assert {r["kind"] for r in records} >= {"decode", "prefill", "startup", "ready"}


def test_inspect_summarizes_server_info_and_metrics() -> None:
    info = cli("inspect", str(FIXTURES / "sglang-samples" / "server_info" /
                              "get_server_info_v0.5.6_qwen2.5-0.5b_2025-12-08.json"))
    assert "server_info" in info.stdout and "max_total_num_tokens=20480" in info.stdout
    metrics = cli("inspect", str(FIXTURES / "sglang-samples" / "metrics" /
                                 "docs_production_metrics_2025-03-03_llama-3.1-8b.txt"))
    assert "metrics" in metrics.stdout and "running_req=162" in metrics.stdout


def test_diagnose_a_live_simulated_server(sim_fleet) -> None:
    import threading

    import httpx

    (h,) = sim_fleet(1, model="qwen3.6-27b-fp8", **{"server.mamba_strategy": "extra_buffer",
                                                    "sim.time_scale": 10.0})
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                try:
                    client.post(f"{h.url}/generate", json={
                        "text": "x", "sampling_params": {"max_new_tokens": 2048}})
                except httpx.HTTPError:
                    return  # the server is being stopped at the end of the test

    # well over the cap of 31, so a loaded machine still keeps a queue at the server
    threads = [threading.Thread(target=load, daemon=True) for _ in range(40)]
    for t in threads:
        t.start()
    try:
        proc = cli("diagnose", h.url, "--seconds", "6")
    finally:
        stop.set()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("mamba-bound"), proc.stdout


def test_diagnose_a_log_file(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(
        "[2026-07-20 14:00:00] Mamba Cache is allocated. max_mamba_cache_size: 80, conv_state "
        "size: 0.22GB, ssm_state size: 11.39GB \n"
        "[2026-07-20 14:00:01] max_total_num_tokens=362368, chunked_prefill_size=16384, "
        "max_prefill_tokens=16384, max_running_requests=16, context_len=262144, "
        "available_gpu_mem=31.02 GB\n" + "".join(
            f"[2026-07-20 14:03:{s:02d}] Decode batch, #running-req: 16, #full token: 76032, "
            "full token usage: 0.21, mamba num: 48, mamba usage: 0.60, accept len: 3.21, "
            "accept rate: 0.74, cuda graph: True, gen throughput (token/s): 1187.55, "
            "#queue-req: 398\n" for s in range(0, 50, 5)))
    proc = cli("diagnose", "--log", str(log))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("mamba-bound") and "80 slots / 5" in proc.stdout
