"""The vLLM engine (tasks/engines/vllm.py): the seam a second server goes through — its
command line, its KV pool from /metrics, its metric names, its request and answer shapes,
and the SGLang levers it refuses by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.prompt_row import PromptRow
from infra.settings import load_settings
from infra.sglang.flags import ServerFlags
from tasks.engines import build_engine
from tasks.engines.vllm import VLLMMetrics, VLLMRequests, VLLMServers, cache_config
from tasks.requests import DispatchOptions

METRICS = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="8192"} 1.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 12.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} 5000.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
"""


def _engine(tmp_path: Path, **server: object) -> VLLMServers:
    settings = load_settings(None, engine="vllm", model="Qwen/Qwen3-8B", python="py",
                             gpus=[0, 1], output=str(tmp_path),
                             **{f"server.{k}": v for k, v in server.items()})
    engine = build_engine(settings)
    assert isinstance(engine, VLLMServers)
    return engine


def test_it_launches_vllm_serve_with_its_own_spelling_of_the_levers(tmp_path: Path) -> None:
    engine = _engine(tmp_path, mem_fraction_static=0.9, max_running_requests=128)
    specs = engine.launch_specs(engine.settings.server, tmp_path)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == ["0", "1"]
    argv = list(specs[0].argv)
    assert argv[:5] == ["py", "-m", "vllm.entrypoints.cli.main", "serve", "Qwen/Qwen3-8B"]
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.9"
    assert argv[argv.index("--max-num-seqs") + 1] == "128"
    assert argv[argv.index("--port") + 1] == str(specs[0].port)
    assert engine.hardware("0.5.17") is None  # no planner: the tuner never moves it


@pytest.mark.parametrize("field, value", [("max_mamba_cache_size", 64),
                                          ("mamba_full_memory_ratio", 2.0),
                                          ("disable_radix_cache", True)])
def test_sglang_only_levers_are_refused_by_name(tmp_path: Path, field: str,
                                                value: object) -> None:
    engine = _engine(tmp_path, max_running_requests=64, **{field: value})
    with pytest.raises(ValueError, match=rf"server\.{field}: engine=vllm has no such lever"):
        engine.check_before_start()
    with pytest.raises(ValueError, match=rf"server\.{field}"):
        engine.server_flags(ServerFlags(**{field: value}))


def test_a_cap_is_required_since_vllm_publishes_none(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"server\.max_running_requests: engine=vllm needs it"):
        _engine(tmp_path).check_before_start()


def test_the_kv_pool_and_the_gauges_come_from_vllms_names() -> None:
    assert cache_config(METRICS) == {"block_size": "16", "cache_dtype": "auto",
                                     "num_gpu_blocks": "8192"}
    assert cache_config("# nothing\n") is None
    sample = VLLMMetrics().read(METRICS, "server-0", 1.0, 1)
    assert (sample.running, sample.queued, sample.kv_usage) == (12, 3, 0.42)
    assert (sample.generation_tokens_total, sample.retracted) == (5000.0, 2.0)


def _opts() -> DispatchOptions:
    return DispatchOptions(model="m", api_key=None,
                           sampling={"max_new_tokens": 32, "temperature": 0.0, "top_p": 1.0,
                                     "seed": None, "ignore_eos": False, "stop": []},
                           request_timeout_s=10, max_attempts=1, backoff_s=0.1)


def test_rows_go_to_the_openai_completions_route_and_answers_come_back() -> None:
    shapes = VLLMRequests()
    path, body = shapes.build(PromptRow.from_columns({"prompt": "hi"}), _opts())
    assert (path, body["prompt"], body["max_tokens"]) == ("/v1/completions", "hi", 32)
    path, body = shapes.build(PromptRow.from_columns({"input_ids": [1, 2, 3]}), _opts())
    assert body["prompt"] == [1, 2, 3]
    answer = shapes.parse("/v1/completions", {
        "choices": [{"text": "hello", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 32}})
    assert (answer["completion"], answer["completion_tokens"]) == ("hello", 32)
    with pytest.raises(ValueError, match="regex: engine=vllm does not send regex"):
        shapes.build(PromptRow.from_columns({"prompt": "hi", "regex": "a+"}), _opts())
