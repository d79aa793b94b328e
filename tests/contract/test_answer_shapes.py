"""The simulator answers like real SGLang: the same calls, the same keys, the same framing.

The reference is real SGLang 0.5.17 on the H200 (the tiny Qwen3-Next with its tokenizer),
captured by bench/real_sglang/capture_answers.py into tests/fixtures/sglang-0.5.17/
tiny.answers.json. Each call there is repeated against the simulator; every key of the real
answer must be in the simulator's (recursively), and the real /metrics families must cover
the simulator's (no series real SGLang does not emit).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.contract.checks import check_metrics, family_names, missing_keys, shape

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REAL = json.loads((FIXTURES / "sglang-0.5.17" / "tiny.answers.json").read_text())
LENGTH = {"ignore_eos": True}  # the real answers finished by length; so must the sim's
CALLS: dict[str, tuple[str, str, dict[str, Any] | None]] = {
    "v1_models": ("get", "/v1/models", None),
    "completions_unknown_model": ("post", "/v1/completions", {
        "model": "x", "prompt": "Hello", "max_tokens": 8, **LENGTH}),
    "completions_n2": ("post", "/v1/completions", {
        "prompt": "Hello", "max_tokens": 8, "n": 2, **LENGTH}),
    "chat": ("post", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, **LENGTH}),
    "generate_text": ("post", "/generate", {
        "text": "Hello", "sampling_params": {"max_new_tokens": 8, **LENGTH}}),
    "generate_ids": ("post", "/generate", {
        "input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 8, **LENGTH}}),
    "generate_list": ("post", "/generate", {
        "text": ["a", "b"], "sampling_params": {"max_new_tokens": 4, **LENGTH}}),
}


def call(url: str, name: str) -> httpx.Response:
    method, path, body = CALLS[name]
    send: Callable[..., httpx.Response] = getattr(httpx, method)
    return send(url + path, timeout=60, **({"json": body} if body is not None else {}))


@pytest.mark.parametrize("name", sorted(CALLS))
def test_same_status_and_keys_as_real_sglang(sim_url: str, name: str) -> None:
    real = REAL[name]
    resp = call(sim_url, name)
    assert resp.status_code == real["status"], resp.text
    assert missing_keys(shape(json.loads(real["body"])), shape(resp.json())) == []


def test_n_samples_are_n_choices(sim_url: str) -> None:
    body = call(sim_url, "completions_n2").json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"]["completion_tokens"] == 16
    assert body["id"].count("_") == 1  # as SGLang joins the samples' ids


def test_unknown_model_is_echoed_like_sglang(sim_url: str) -> None:
    assert call(sim_url, "completions_unknown_model").json()["model"] == "x"


def test_stream_is_framed_like_sglang(sim_url: str) -> None:
    real = [ln for ln in REAL["stream"]["body"].split("\n\n") if ln]
    resp = httpx.post(sim_url + "/v1/completions", json={
        "prompt": "Hi", "max_tokens": 4, "stream": True, **LENGTH}, timeout=60)
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = [ln for ln in resp.text.split("\n\n") if ln]
    assert events[-1] == real[-1] == "data: [DONE]"
    real_last, sim_last = (json.loads(e.removeprefix("data: ")) for e in (real[-2], events[-2]))
    assert missing_keys(shape(real_last), shape(sim_last)) == []
    assert sim_last["choices"][0]["finish_reason"] == real_last["choices"][0]["finish_reason"]
    assert len(events) - 1 == 4  # one chunk per token


def test_flush_cache_answers_like_sglang(sim_url: str) -> None:
    resp = httpx.post(sim_url + "/flush_cache", timeout=10)
    assert (resp.status_code, resp.text) == (REAL["flush_cache"]["status"],
                                             REAL["flush_cache"]["body"])


def test_metrics_families_are_real_ones(sim_url: str) -> None:
    call(sim_url, "generate_text")
    text = httpx.get(sim_url + "/metrics", timeout=10).text
    check_metrics(text)
    # (the tiny model's scrape was cut at 20,000 characters; the 27B's is whole)
    real = family_names((FIXTURES / "sglang-0.5.17" / "extra_buffer.metrics-after-load.txt")
                        .read_text())
    assert family_names(text) - real == set()


def test_the_retraction_counter_is_a_real_one() -> None:
    """Real SGLang shows sglang:num_retracted_requests_total once it has retracted (the
    retraction probe's scrapes); the simulator's counter has that name."""
    from infra.sim.metrics import EngineStats, RequestLatencies, Snapshot, render
    data = FIXTURES.parents[1] / "bench/real_sglang/data/2026-12-01-h200-s6"
    levels = json.loads((data / "limits-retract.results.json").read_text())["retract"]
    real = {k for lv in levels for sample in lv["samples"] for k in sample}
    snap = Snapshot(EngineStats(retracted_total=3), max_total_num_tokens=1, context_len=1,
                    mamba_slots=0, hybrid=False, spec_accept_length=0.0, startup_phases={})
    text = render("m", snap, RequestLatencies(), 1)
    assert any(line.startswith("sglang:num_retracted_requests_total") and line.endswith(" 3.0")
               for line in text.splitlines())
    assert "sglang:num_retracted_requests_total" in real


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/completions", {"prompt": "Hi", "logit_bias": {"5": 1}}, "logit_bias"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/completions", {"prompt": "Hi", "n": 0}, "n"),
    ("/generate", {"text": "Hi", "sampling_params": {"regex": "a+"}}, "sampling_params.regex"),
    ("/generate", {"text": "Hi", "stream": True}, "stream"),
])
def test_what_the_simulator_cannot_honour_is_refused(sim_url: str, path: str,
                                                     body: dict[str, Any], field: str) -> None:
    resp = httpx.post(sim_url + path, json=body, timeout=10)
    assert resp.status_code == 400
    assert f"`{field}`" in resp.text
