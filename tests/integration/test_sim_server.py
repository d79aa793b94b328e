"""The simulated server speaks SGLang's API, metrics and log formats, as a real process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infra.sglang.flags import ServerFlags
from infra.sglang.memory import plan_memory
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sim.text import complete
from tasks.health import ServerStartFailed, wait_until_healthy


def test_endpoints_answer_like_sglang(sim_fleet) -> None:
    (h,) = sim_fleet(1)
    gen = httpx.post(f"{h.url}/generate", json={"text": "Explain mamba.",
                                                "sampling_params": {"max_new_tokens": 16}})
    assert gen.status_code == 200
    body = gen.json()
    assert set(body) == {"text", "output_ids", "meta_info"}
    meta = body["meta_info"]
    assert meta["finish_reason"]["type"] in ("stop", "length")
    assert meta["completion_tokens"] == len(body["output_ids"]) <= 16
    chat = httpx.post(f"{h.url}/v1/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}).json()
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert chat["usage"]["completion_tokens"] <= 8
    comp = httpx.post(f"{h.url}/v1/completions", json={"model": "m", "prompt": "x",
                                                      "max_tokens": 4}).json()
    assert comp["object"] == "text_completion" and "text" in comp["choices"][0]
    for path in ("/server_info", "/get_server_info"):
        info = httpx.get(f"{h.url}{path}").json()
        assert info["status"] == "ready" and info["max_total_num_tokens"] > 0
        assert info["internal_states"][0]["effective_max_running_requests_per_dp"] > 0
    assert httpx.get(f"{h.url}/health_generate").status_code == 200
    assert httpx.get(f"{h.url}/v1/models").json()["data"][0]["id"]


def test_pools_match_the_planner(sim_fleet) -> None:
    (h,) = sim_fleet(1, **{"server.mamba_strategy": "no_buffer"})
    info = httpx.get(f"{h.url}/server_info").json()
    plan = plan_memory(model_profile("Qwen/Qwen3.6-27B"), gpu_profile("rtx-pro-6000"),
                       ServerFlags(mamba_strategy="no_buffer"), "0.5.23")
    assert info["max_total_num_tokens"] == plan.max_total_num_tokens
    state = info["internal_states"][0]
    assert state["max_mamba_cache_size"] == plan.mamba_slots
    assert state["effective_max_running_requests_per_dp"] == plan.max_running_requests
    log = Path(h.log_path).read_text()
    assert f"max_running_requests={plan.max_running_requests}" in log
    assert f"max_mamba_cache_size: {plan.mamba_slots}" in log
    assert "The server is fired up and ready to roll!" in log


def test_completions_are_deterministic(sim_fleet) -> None:
    (h,) = sim_fleet(1)
    params: dict[str, object] = {"max_new_tokens": 24, "sampling_seed": 3}
    req = {"text": "same prompt", "sampling_params": params}
    a = httpx.post(f"{h.url}/generate", json=req).json()
    b = httpx.post(f"{h.url}/generate", json=req).json()
    assert a["text"] == b["text"] and a["output_ids"] == b["output_ids"]
    expected = complete("same prompt", params, seed=0)
    assert a["text"] == expected.text


def test_metrics_parse_with_prometheus_client(sim_fleet) -> None:
    (h,) = sim_fleet(1)
    httpx.post(f"{h.url}/generate", json={"text": "a", "sampling_params": {"max_new_tokens": 8}})
    text = httpx.get(f"{h.url}/metrics").text
    names = {f.name for f in text_string_to_metric_families(text)}
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                 "sglang:mamba_usage", "sglang:gen_throughput", "sglang:generation_tokens"):
        assert name in names


def test_api_key_guards_all_but_health_and_metrics(sim_fleet) -> None:
    (h,) = sim_fleet(1, api_key="k3y")
    assert httpx.get(f"{h.url}/health").status_code == 200
    assert httpx.get(f"{h.url}/metrics").status_code == 200
    assert httpx.post(f"{h.url}/generate", json={"text": "a"}).status_code == 401
    ok = httpx.post(f"{h.url}/generate", json={"text": "a"},
                    headers={"Authorization": "Bearer k3y"})
    assert ok.status_code == 200


def test_too_long_request_is_a_400_with_a_message(sim_fleet) -> None:
    (h,) = sim_fleet(1, **{"server.context_length": 64})
    resp = httpx.post(f"{h.url}/generate", json={"text": "word " * 400,
                                                  "sampling_params": {"max_new_tokens": 8}})
    assert resp.status_code == 400
    assert "maximum context length" in resp.json()["error"]["message"]


def start_27b(*flags: str) -> subprocess.CompletedProcess[str]:
    """A simulated 27B server started with these flags, expected to refuse (port 1)."""
    return subprocess.run(
        [sys.executable, "-m", "infra.sim", "--model-path", "Qwen/Qwen3.6-27B",
         "--port", "1", *flags],
        capture_output=True, text=True, timeout=60,
        env={"EXPANSION_SIM_STARTUP_S": "0", "PATH": "/usr/bin:/bin"},
        cwd=Path(__file__).resolve().parents[2])


def test_flags_that_do_not_fit_refuse_to_start() -> None:
    proc = start_27b("--mem-fraction-static", "0.5")
    assert proc.returncode != 0
    assert "mem_fraction_static=0.500 leaves no memory" in proc.stdout


def test_a_flag_the_release_does_not_have_refuses_to_start() -> None:
    """SGLang's argparse exits on it; a simulator that carried `--gpu h100` would serve as if
    the flag meant something (here: nothing, on the default GPU)."""
    proc = start_27b("--gpu", "h100")
    assert proc.returncode == 1
    assert "--gpu: not a flag SGLang 0.5.17 accepts" in proc.stderr, proc.stderr[-2000:]


def test_an_answer_stops_on_the_models_own_eos_with_ids_inside_its_vocabulary(
        sim_fleet) -> None:
    """LFM2-8B-A1B's EOS is 7 and its vocabulary 65,536: Qwen's 151,645 would be a token it
    cannot emit (ModelConfig._get_hf_eos_token_id reads config and generation config)."""
    folder = Path(__file__).resolve().parents[2] / "bench/real_sglang/models/lfm2-8b-a1b"
    (h,) = sim_fleet(1, model=str(folder), weights_gib=15.53, **{"sim.gpu": "h100"})
    finishes, ids = [], []
    for i in range(12):
        body = httpx.post(f"{h.url}/generate", json={
            "text": f"prompt {i}", "sampling_params": {"max_new_tokens": 24}}).json()
        finishes.append(body["meta_info"]["finish_reason"])
        ids += body["output_ids"]
    stops = [f for f in finishes if f["type"] == "stop"]
    assert stops and all(f["matched"] == 7 for f in stops)
    assert ids and max(ids) < 65536


def test_startup_failure_is_reported_with_the_log_tail(sim_fleet) -> None:
    handles = sim_fleet(1, wait=False, **{"sim.faults": {"fail_start": "oom"}})
    try:
        wait_until_healthy(handles, None, 30)
    except ServerStartFailed as exc:
        assert "exited during startup" in str(exc)
        assert "CUDA out of memory" in exc.log_tail
    else:
        raise AssertionError("the OOM server was reported healthy")


@pytest.mark.parametrize(("model", "backend", "refused"), [
    ("nemotron-3-nano-4b", "triton", "AssertionError: NemotronHForCausalLM does not support "
                                     "triton attention backend,as the first layer"),
    ("lfm2-1.2b", "triton", "AssertionError: Lfm2ForCausalLM does not support triton"),
])
def test_triton_attention_is_refused_at_start_as_sglang_does(model: str, backend: str,
                                                             refused: str) -> None:
    """Real 0.5.17 asserts in server_args.py; the launcher refuses it even earlier
    (tasks/engines.check_attention_backend), this is for a server someone else starts."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "infra.sim", "--model-path",
         str(root / "bench" / "real_sglang" / "models" / model), "--port", "1",
         "--attention-backend", backend],
        capture_output=True, text=True, timeout=60,
        env={"EXPANSION_SIM_STARTUP_S": "0", "EXPANSION_SIM_WEIGHTS_GIB": "2",
             "EXPANSION_SIM_GPU": "h200", "PATH": "/usr/bin:/bin"}, cwd=root)
    assert proc.returncode == 1 and refused in proc.stdout, proc.stdout[-2000:]
    from infra.sim.startup import refused_backend

    assert refused_backend("NemotronHForCausalLM", "flashinfer") is None
    assert refused_backend("Qwen3_5ForConditionalGeneration", "triton") is None
