"""The simulator's inputs: SGLang's own argv, plus sim-only knobs from EXPANSION_SIM_* env vars.

Taking SGLang's flags verbatim is what lets `engine=sim` and `engine=sglang` share one launch
path; what a real server learns from its hardware (GPU model, startup time) comes from env.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from infra.sglang.flags import ServerFlags


@dataclass(frozen=True)
class Faults:
    """Fault injection for tests: each field off by default."""

    error_rate: float = 0.0  # share of generate calls answered with HTTP 500
    reset_rate: float = 0.0  # share of generate calls whose connection is dropped
    hang_rate: float = 0.0  # share of generate calls that never answer
    crash_after_requests: int | None = None  # exit(1) abruptly after N completed requests
    fail_start: str | None = None  # "oom" or "error": refuse to start
    start_delay_s: float | None = None  # override the startup delay
    oom_above_mem_fraction: float | None = None  # CUDA OOM at start above this fraction


@dataclass(frozen=True)
class SimConfig:
    model: str
    host: str
    port: int
    api_key: str | None
    flags: ServerFlags
    gpu: str = "rtx-pro-6000"
    version: str = "0.5.23"
    time_scale: float = 1.0
    startup_s: float | None = None  # None: modeled from the weights (see modeled_startup_s)
    seed: int = 0
    accept_len: float | None = None
    decode_log_interval: int = 40
    skip_tokenizer_init: bool = False  # SGLang then takes input_ids only, answers output_ids
    weights_gib: float | None = None  # for a config.json model folder without an index
    faults: Faults = field(default_factory=Faults)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m infra.sim",
                                description="Simulated SGLang server (SGLang's flags).")
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--api-key")
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--max-total-tokens", type=int)
    p.add_argument("--mamba-radix-cache-strategy", "--mamba-scheduler-strategy",
                   dest="mamba_strategy", default="auto",
                   choices=["auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"])
    p.add_argument("--max-mamba-cache-size", type=int)
    p.add_argument("--mamba-full-memory-ratio", type=float)
    p.add_argument("--mamba-ssm-dtype", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--disable-overlap-schedule", action="store_true")
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--context-length", type=int)
    p.add_argument("--page-size", type=int)
    p.add_argument("--chunked-prefill-size", type=int)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--speculative-algorithm")
    p.add_argument("--speculative-num-steps", type=int)
    p.add_argument("--speculative-eagle-topk", type=int)
    p.add_argument("--speculative-num-draft-tokens", type=int)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--decode-log-interval", type=int, default=40)
    p.add_argument("--skip-tokenizer-init", action="store_true")
    return p


def merge_config_file(argv: list[str]) -> list[str]:
    """SGLang's `--config FILE.yaml`: its keys become flags placed before the command line's
    own, so the command line wins (sglang/srt/utils/server_args_config_parser.py)."""
    if "--config" not in argv:
        return argv
    at = argv.index("--config")
    if at + 1 >= len(argv):
        raise ValueError("No config file specified after --config flag!")
    path = Path(argv[at + 1])
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise ValueError(f"Config file must be YAML format, got: {path.suffix}")
    if not path.exists():
        raise ValueError(f"Config file not found: {path}")
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ValueError("Config file must contain a dictionary at root level")
    extra: list[str] = []
    for key, value in data.items():
        if isinstance(value, bool):
            extra += [f"--{key}"] if value else []
        elif isinstance(value, list):
            extra += [f"--{key}", *map(str, value)] if value else []
        elif isinstance(value, dict):
            extra += [f"--{key}", json.dumps(value)]
        else:
            extra += [f"--{key}", str(value)]
    return extra + argv[:at] + argv[at + 2:]


def parse_sim_args(argv: list[str], env: dict[str, str] | None = None) -> SimConfig:
    """Parse SGLang argv (unknown flags are ignored, as extras are SGLang's business)."""
    env = dict(os.environ) if env is None else env
    ns, _unknown = _parser().parse_known_args(merge_config_file(argv))
    flags = ServerFlags(
        mem_fraction_static=ns.mem_fraction_static,
        max_running_requests=ns.max_running_requests,
        max_total_tokens=ns.max_total_tokens,
        mamba_strategy=ns.mamba_strategy,
        max_mamba_cache_size=ns.max_mamba_cache_size,
        mamba_full_memory_ratio=ns.mamba_full_memory_ratio,
        mamba_ssm_dtype=ns.mamba_ssm_dtype,
        disable_overlap_schedule=ns.disable_overlap_schedule,
        disable_radix_cache=ns.disable_radix_cache,
        context_length=ns.context_length,
        page_size=ns.page_size,
        chunked_prefill_size=ns.chunked_prefill_size,
        kv_cache_dtype=ns.kv_cache_dtype,
        tp_size=ns.tp_size,
        speculative_algorithm=ns.speculative_algorithm,
        speculative_num_steps=ns.speculative_num_steps,
        speculative_eagle_topk=ns.speculative_eagle_topk,
        speculative_num_draft_tokens=ns.speculative_num_draft_tokens,
        enable_metrics=ns.enable_metrics,
    )
    faults_raw = env.get("EXPANSION_SIM_FAULTS")
    faults = Faults(**json.loads(faults_raw)) if faults_raw else Faults()
    accept = env.get("EXPANSION_SIM_ACCEPT_LEN")
    return SimConfig(
        model=ns.model_path, host=ns.host, port=ns.port, api_key=ns.api_key, flags=flags,
        gpu=env.get("EXPANSION_SIM_GPU", "rtx-pro-6000"),
        version=env.get("EXPANSION_SIM_SGLANG_VERSION", "0.5.23"),
        time_scale=float(env.get("EXPANSION_SIM_TIME_SCALE", "1")),
        startup_s=float(env["EXPANSION_SIM_STARTUP_S"]) if env.get("EXPANSION_SIM_STARTUP_S")
        else None,
        seed=int(env.get("EXPANSION_SIM_SEED", "0")),
        accept_len=float(accept) if accept else None,
        decode_log_interval=ns.decode_log_interval,
        skip_tokenizer_init=ns.skip_tokenizer_init,
        weights_gib=float(env["EXPANSION_SIM_WEIGHTS_GIB"]) if env.get("EXPANSION_SIM_WEIGHTS_GIB")
        else None,
        faults=faults,
    )
