"""The contract against a running server: the simulator in CI, real SGLang on a GPU machine.

    EXPANSION_CONTRACT_URL=http://127.0.0.1:30000 [EXPANSION_CONTRACT_TOKENIZED=1] \\
    [EXPANSION_CONTRACT_LOG=server.log] pytest tests/contract/test_live.py

runs it against that server (TOKENIZED=1: it was started with --skip-tokenizer-init; LOG: its
log file, for the log-line checks). Without a URL, each test runs on the simulator, started
through the pipeline's own launch path, once with a tokenizer and once without.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.contract.checks import (
    check_chat,
    check_generate,
    check_log,
    check_metrics,
    check_server_info,
)

LIVE_URL = os.environ.get("EXPANSION_CONTRACT_URL")
MODEL_27B = Path(__file__).resolve().parents[1] / "fixtures" / "models" / "qwen3.6-27b-text"


@dataclass(frozen=True)
class Target:
    url: str
    tokenized: bool  # started with --skip-tokenizer-init: input_ids in, output_ids out
    log_path: str | None
    model: str


@pytest.fixture(params=[False, True] if LIVE_URL is None else [None],
                ids=(["sim", "sim-skip-tokenizer"] if LIVE_URL is None else ["live"]))
def target(request: pytest.FixtureRequest, sim_fleet: Callable[..., list]) -> Target:
    if LIVE_URL is not None:
        models = httpx.get(f"{LIVE_URL}/v1/models", timeout=10).json()
        return Target(LIVE_URL, os.environ.get("EXPANSION_CONTRACT_TOKENIZED") == "1",
                      os.environ.get("EXPANSION_CONTRACT_LOG"), models["data"][0]["id"])
    extra = ["--skip-tokenizer-init"] if request.param else []
    (handle,) = sim_fleet(1, model=str(MODEL_27B), weights_gib=50.16, gpu_type="h200",
                          sglang_version="0.5.17", **{
                              "sim.gpu": "h200", "server.extra_args": extra,
                              "server.mamba_strategy": "extra_buffer"})
    return Target(handle.url, request.param, handle.log_path, str(MODEL_27B))


def generate(t: Target, max_new: int) -> dict:
    prompt = {"input_ids": [11, 12, 13, 14, 15]} if t.tokenized else {"text": "Explain mamba."}
    resp = httpx.post(f"{t.url}/generate", json={**prompt, "sampling_params": {
        "max_new_tokens": max_new, "ignore_eos": True, "temperature": 0}}, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_health_and_server_info(target: Target) -> None:
    assert httpx.get(f"{target.url}/health", timeout=10).status_code == 200
    for path in ("/server_info", "/get_server_info"):
        check_server_info(httpx.get(f"{target.url}{path}", timeout=10).json())


def test_generate_and_metrics(target: Target) -> None:
    check_generate(generate(target, 12), 12, target.tokenized, ignore_eos=True)
    check_metrics(httpx.get(f"{target.url}/metrics", timeout=10).text)


def test_chat(target: Target) -> None:
    if target.tokenized:
        pytest.skip("no tokenizer: SGLang cannot apply a chat template")
    body = httpx.post(f"{target.url}/v1/chat/completions", json={
        "model": target.model, "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8}, timeout=120).json()
    check_chat(body, 8)


def test_log_lines(target: Target) -> None:
    if target.log_path is None:
        pytest.skip("set EXPANSION_CONTRACT_LOG to the server's log file")
    for _ in range(3):  # enough decode steps for a Decode line (decode_log_interval 40)
        generate(target, 64)
    check_log(Path(target.log_path).read_text())
