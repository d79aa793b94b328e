"""vLLM: `vllm serve` on the GPU nodes' Python, one per GPU — the seam for a second server.

It launches, waits healthy, measures its KV pool, reads its /metrics and sends it rows over
the OpenAI routes vLLM serves. The tuner's planner models SGLang's pools only, so the tuner
measures a vLLM fleet and never moves it (`hardware` is None); the server flags that are
SGLang's levers are refused by name before anything starts, not silently dropped.
"""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from infra.output_row import Answer
from infra.prompt_row import PromptRow
from infra.sglang.client import ServerAnswerError, get_metrics_text
from infra.sglang.flags import ServerFlags
from tasks.capacity import Capacity
from tasks.engines.base import LocalServers
from tasks.local_servers import ServerHandle
from tasks.monitor import Sample
from tasks.requests import (
    DispatchOptions,
    MalformedAnswer,
    build_request,
    error_message,
    response_format,
    sampling_for,
)
from tasks.requests import parse_response as parse_sglang_response

# ServerFlags vLLM has an equivalent of, and its spelling.
VLLM_FLAGS = {"mem_fraction_static": "--gpu-memory-utilization",
              "max_running_requests": "--max-num-seqs", "context_length": "--max-model-len",
              "tp_size": "--tensor-parallel-size"}
# ServerFlags that are SGLang's and mean nothing to vLLM (refused when set).
SGLANG_ONLY = ("max_total_tokens", "max_mamba_cache_size", "mamba_full_memory_ratio",
               "mamba_ssm_dtype", "page_size", "chunked_prefill_size", "speculative_algorithm",
               "disable_overlap_schedule", "disable_radix_cache")


def unsupported_flags(flags: ServerFlags) -> None:
    """Refuse, by name, a set flag that only SGLang has."""
    for field in SGLANG_ONLY:
        if getattr(flags, field) not in (None, False):
            raise ValueError(f"server.{field}: engine=vllm has no such lever (it is "
                             "SGLang's); remove it or use engine=sglang")
    if flags.mamba_strategy != "auto" or flags.speculative:
        raise ValueError("server.mamba_strategy/speculative_*: engine=vllm has no such lever "
                         "here; remove it or use engine=sglang")


def cache_config(text: str) -> dict[str, str] | None:
    """The labels of `vllm:cache_config_info` (block_size, num_gpu_blocks, …), or None."""
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if (sample.name.startswith("vllm:cache_config_info")
                        and "num_gpu_blocks" in sample.labels):
                    return dict(sample.labels)
    except ValueError:
        return None
    return None


def _sums(text: str) -> dict[str, float]:
    """Every sample's value by name, summed over label sets (engines), in one parse."""
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + float(sample.value)
    return sums


class VLLMMetrics:
    """What the monitor reads from vLLM's /metrics, by vLLM's names (summed over engines)."""

    def read(self, text: str, server: str, t: float, epoch: int) -> Sample:
        try:
            sums = _sums(text)  # the monitor reads every server twice a second: parse once
            get = {name: sums.get(f"vllm:{name}") for name in (
                "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                "generation_tokens_total", "num_preemptions_total", "request_success_total")}
        except ValueError:
            return Sample(t, epoch, server, True, None, None, None, None, None, None)
        running, waiting = get["num_requests_running"], get["num_requests_waiting"]
        return Sample(t, epoch, server, True, None if running is None else int(running),
                      None if waiting is None else int(waiting), get["kv_cache_usage_perc"],
                      None, None, get["generation_tokens_total"], get["num_preemptions_total"],
                      None, get["request_success_total"], None)


class VLLMRequests:
    """Rows over vLLM's OpenAI routes: chat rows to /v1/chat/completions (the body SGLang's
    chat route takes too), the rest to /v1/completions with the text or the token ids."""

    def build(self, row: PromptRow, opts: DispatchOptions,
              sample: int = 0) -> tuple[str, dict[str, Any]]:
        grammar = row.grammar()
        if grammar:
            column = next(iter(grammar))
            raise ValueError(f"{column}: engine=vllm does not send {column} constraints "
                             "yet; use json_schema, or engine=sglang")
        if row.messages is not None:
            return build_request(row, opts, sample)
        sampling = sampling_for(row, opts, sample)
        body: dict[str, Any] = {
            "model": opts.model,
            "prompt": list(row.input_ids) if row.input_ids is not None else row.prompt,
            "max_tokens": sampling["max_new_tokens"], "temperature": sampling["temperature"],
            "top_p": sampling["top_p"],
            **{k: sampling[k] for k in ("seed", "ignore_eos", "stop") if k in sampling}}
        if row.json_schema is not None:
            body["response_format"] = response_format(row.json_schema)
        return "/v1/completions", body

    def parse(self, path: str, body: Any) -> Answer:
        """A completions answer read as the chat answer it differs from only in where the
        text sits (`choices[0].text`): one reader of the OpenAI usage block."""
        if path != "/v1/completions":
            return parse_sglang_response(path, body)
        try:
            choice = body["choices"][0]
            as_chat = {"choices": [{"message": {"content": choice["text"]},
                                    "finish_reason": choice.get("finish_reason")}],
                       "usage": body["usage"]}
        except (KeyError, IndexError, TypeError) as exc:
            raise MalformedAnswer(
                f"malformed answer from server ({type(exc).__name__}: {exc})") from exc
        return parse_sglang_response("/v1/chat/completions", as_chat)

    def refusal(self, resp: httpx.Response) -> str:
        return error_message(resp)


class VLLMServers(LocalServers):
    name = "vllm"
    checks_gpu_memory_after_stop = True
    requests = VLLMRequests()
    metrics = VLLMMetrics()

    def program(self) -> list[str]:
        return [self.settings.python or "python", "-m", "vllm.entrypoints.cli.main", "serve"]

    def check_before_start(self) -> None:
        super().check_before_start()
        unsupported_flags(self.settings.server)
        if self.settings.server.max_running_requests is None:
            raise ValueError("server.max_running_requests: engine=vllm needs it (vLLM's "
                             "--max-num-seqs; the client sizes its concurrency by it); set it")

    def server_flags(self, flags: ServerFlags) -> list[str]:
        unsupported_flags(flags)
        args: list[str] = []
        for field, spelling in VLLM_FLAGS.items():
            value = getattr(flags, field)
            if value is not None and not (field == "tp_size" and value == 1):
                args += [spelling, str(value)]
        if flags.kv_cache_dtype != "auto":
            args += ["--kv-cache-dtype", flags.kv_cache_dtype]
        return args + list(flags.extra_args)

    def server_argv(self, flags: ServerFlags, port: int) -> list[str]:
        job = self.settings
        key = ["--api-key", self.api_key] if self.api_key else []
        return [job.model, "--host", job.host, "--port", str(port), *key,
                *self.server_flags(flags)]

    def capacity(self, handle: ServerHandle) -> Capacity:
        """The KV pool from vLLM's `vllm:cache_config_info` (blocks × block size); the cap is
        the --max-num-seqs it was started with (vLLM publishes no figure of its own)."""
        text = get_metrics_text(handle.url, self.api_key)
        info = cache_config(text or "")
        if info is None:
            raise ServerAnswerError(f"{handle.url}/metrics lacks vllm:cache_config_info; is "
                                    "this a vLLM server that finished starting?")
        cap = self.settings.server.max_running_requests or 0
        return Capacity(handle.index, handle.url, None, cap,
                        int(info["num_gpu_blocks"]) * int(info["block_size"]), None, None,
                        handle.fingerprint)
