"""The contract: every answer, field, metric and log line the pipeline relies on.

Each check takes what a server gave (a parsed body, Prometheus text, a log) and raises
AssertionError naming what is missing. The same checks run on recorded real SGLang output
(test_recorded.py), on the simulator (test_live.py in CI) and on a live SGLang server
(test_live.py with --sglang-url, on a GPU machine): the simulator is held to what SGLang does.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from infra.sglang.observe import parse_log
from infra.sglang.server_info import parse_server_info
from tasks.requests import parse_response

# What tasks/monitor.py and the diagnosis read from /metrics (observe.METRIC_KEYS).
METRICS = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
           "sglang:gen_throughput", "sglang:generation_tokens_total",
           "sglang:max_total_num_tokens")
HYBRID_METRICS = ("sglang:mamba_usage", "sglang:full_token_usage")
# What users read on their dashboards (0.5.17 emits them all; so must the simulator).
USER_FAMILIES = ("sglang:num_retracted_reqs", "sglang:num_paused_reqs",
                 "sglang:time_to_first_token_seconds", "sglang:e2e_request_latency_seconds",
                 "sglang:queue_time_seconds", "sglang:cache_hit_rate", "sglang:kv_used_tokens",
                 "sglang:spec_accept_length", "sglang:utilization",
                 "sglang:startup_time_seconds", "sglang:prompt_tokens",
                 "sglang:num_requests")


def check_server_info(body: dict[str, Any], hybrid: bool = True) -> None:
    """tasks/capacity.py needs the effective cap and the KV pool; planning needs the rest."""
    info = parse_server_info(body)
    assert info.max_running_requests and info.max_running_requests > 0, "effective cap"
    assert info.max_total_num_tokens and info.max_total_num_tokens > 0, "max_total_num_tokens"
    assert info.version, "version"
    if hybrid:
        assert info.max_mamba_cache_size and info.max_mamba_cache_size > 0, "mamba slots"
        assert info.mamba_strategy in ("no_buffer", "extra_buffer", "extra_buffer_lazy"), (
            "mamba_radix_cache_strategy")


def metric_names(text: str) -> set[str]:
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(sample.name for sample in family.samples)
    return names


def family_names(text: str) -> set[str]:
    return {family.name for family in text_string_to_metric_families(text)}


def check_metrics(text: str, hybrid: bool = True) -> None:
    names = metric_names(text)
    wanted = METRICS + (HYBRID_METRICS if hybrid else ())
    missing = [m for m in wanted if m not in names]
    assert not missing, f"/metrics lacks {missing}"
    families = family_names(text)
    missing = [m for m in USER_FAMILIES if m not in families]
    assert not missing, f"/metrics lacks the families {missing}"
    assert not [n for n in names if n.endswith("_created")], "no *_created series"


def shape(value: Any) -> Any:
    """A JSON value's structure: dict keys and value types, lists by their first item."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return "number" if isinstance(value, int | float) and not isinstance(value, bool) else (
        type(value).__name__)


def missing_keys(real: Any, other: Any, path: str = "") -> list[str]:
    """The keys of `real` (recursively) that `other` lacks; None matches any type."""
    if isinstance(real, dict) and isinstance(other, dict):
        out = [f"{path}.{k}" for k in real if k not in other]
        for k in real.keys() & other.keys():
            out += missing_keys(real[k], other[k], f"{path}.{k}")
        return out
    if isinstance(real, list) and isinstance(other, list) and real and other:
        return missing_keys(real[0], other[0], path + "[]")
    if "NoneType" in (real, other) or real == other:
        return []
    return [f"{path} ({real} vs {other})"]


def check_generate(body: dict[str, Any], max_new_tokens: int, tokenized: bool,
                   ignore_eos: bool) -> None:
    """tasks/dispatch.py's reading of a native /generate answer."""
    fields = parse_response("/generate", body)
    assert ("text" not in body) == tokenized, "text present iff the server has a tokenizer"
    assert isinstance(body.get("output_ids"), list), "output_ids"
    assert fields["prompt_tokens"] > 0
    assert 0 < fields["completion_tokens"] <= max_new_tokens
    if ignore_eos:
        assert fields["completion_tokens"] == max_new_tokens, "ignore_eos honoured"
        assert fields["finish_reason"] == "length"
    assert isinstance(body["meta_info"].get("cached_tokens"), int), "cached_tokens"


def check_chat(body: dict[str, Any], max_tokens: int) -> None:
    fields = parse_response("/v1/chat/completions", body)
    assert body["object"] == "chat.completion"
    assert 0 < fields["completion_tokens"] <= max_tokens


def check_log(text: str, hybrid: bool = True) -> None:
    """The log lines `expansion inspect`/`diagnose --log` and the tuner read."""
    records = parse_log(text)
    kinds = {r["kind"] for r in records}
    assert {"startup", "ready", "prefill", "decode"} <= kinds, f"log kinds: {sorted(kinds)}"
    startup: dict[str, Any] = {}
    for rec in records:
        if rec["kind"] == "startup":
            startup.update({k: v for k, v in rec.items() if v is not None})
    assert startup.get("max_total_num_tokens"), "max_total_num_tokens= line"
    assert startup.get("max_running_requests"), "max_running_requests= line"
    decode = [r for r in records if r["kind"] == "decode"]
    assert all(r["running_req"] is not None and r["gen_throughput"] is not None
               for r in decode), "Decode lines carry #running-req and gen throughput"
    if hybrid:
        assert startup.get("max_mamba_cache_size"), "Mamba Cache is allocated line"
        assert all(r["mamba_num"] is not None and r["mamba_usage"] is not None
                   for r in decode), "Decode lines carry mamba num and mamba usage"
