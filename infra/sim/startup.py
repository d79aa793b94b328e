"""The simulated server's start: SGLang-format log lines, the modeled start-up time, and
the way SGLang dies when a start fails (reference §6.3 for the timings)."""

from __future__ import annotations

import os
import sys
from datetime import datetime
from pathlib import Path

from infra.sglang.memory import MemoryPlan
from infra.sim.config import Faults, SimConfig

READY_LINE = "The server is fired up and ready to roll!"


def log(message: str) -> None:
    """One SGLang-format log line on stdout (the launcher sends it to the log file). A line
    the disk refuses is lost, not fatal: SGLang logs through `logging`, whose handlers report
    a failed write and carry on serving."""
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    try:
        sys.stdout.write(f"[{stamp}] {message}\n")
        sys.stdout.flush()
    except OSError:
        pass


def fail_start(message: str, kind: str = "ValueError") -> None:
    log("Scheduler hit an exception: Traceback (most recent call last):")
    sys.stdout.write(f"{kind}: {message}\n")
    log("Received sigquit from a child process. It usually means the child failed.")
    sys.stdout.flush()
    os._exit(1)


# SGLang 0.5.17's server_args.py asserts these off triton attention ("the first layer might not
# be an attention layer"), verbatim: NemotronH's message lacks the space after its comma.
_NO_TRITON = {
    "NemotronHForCausalLM": "NemotronHForCausalLM does not support triton attention backend,"
                            "as the first layer might not be an attention layer",
    "NemotronHPuzzleForCausalLM": "NemotronHForCausalLM does not support triton attention "
                                  "backend,as the first layer might not be an attention layer",
    "Lfm2ForCausalLM": "Lfm2ForCausalLM does not support triton attention backend, as the "
                       "first layer might not be an attention layer",
    "Lfm2MoeForCausalLM": "Lfm2MoeForCausalLM does not support triton attention backend, as "
                          "the first layer might not be an attention layer",
}


def refused_backend(architecture: str, attention_backend: str | None) -> str | None:
    """SGLang's assertion message when it refuses this attention backend for the model."""
    return _NO_TRITON.get(architecture) if attention_backend == "triton" else None


# Modeled startup (reference §6.3): imports, weight loading from local NVMe, graph capture.
IMPORT_S = 20.0
WEIGHT_LOAD_GIB_S = 2.0
GRAPH_CAPTURE_S = 30.0


def modeled_startup_s(weights_gib: float) -> float:
    """GPU-time seconds a warm-cache SGLang start takes for this much weight."""
    return IMPORT_S + weights_gib / WEIGHT_LOAD_GIB_S + GRAPH_CAPTURE_S


def startup_lines(cfg: SimConfig, plan: MemoryPlan, free_before: float) -> list[str]:
    lines = [f"Load weight begin. avail mem={free_before:.2f} GB"]
    free_after = free_before - plan.weights_gib
    lines.append(
        f"Load weight end. elapsed={plan.weights_gib / WEIGHT_LOAD_GIB_S:.2f} s, "
        f"type=Sim{plan.model.split('/')[-1]}, "
        f"avail mem={free_after:.2f} GB, mem usage={plan.weights_gib:.2f} GB.")
    lines += list(plan.warnings)
    if plan.mamba_cap is not None:
        mamba = (f"Mamba Cache is allocated. max_mamba_cache_size: {plan.mamba_slots}, "
                 f"conv_state size: {plan.conv_state_gib:.2f}GB, "
                 f"ssm_state size: {plan.ssm_state_gib:.2f}GB ")
        if plan.draft_tokens:
            mamba += (f"intermediate_ssm_state_cache size: {plan.intermediate_gib:.2f}GB "
                      f"intermediate_conv_window_cache size: {plan.intermediate_conv_gib:.2f}GB")
        lines.append(mamba)
    half = plan.kv_cache_gib / 2
    lines.append(f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: "
                 f"{plan.max_total_num_tokens}, K size: {half:.2f} GB, V size: {half:.2f} GB")
    pools = plan.kv_cache_gib + plan.conv_state_gib + plan.ssm_state_gib + plan.intermediate_gib
    avail = free_after - pools
    lines.append(f"Memory pool end. avail mem={avail:.2f} GB")
    lines.append(f"Capture target decode CUDA graph begin. This can take up to several minutes. "
                 f"avail mem={avail:.2f} GB")
    lines.append(f"Capture target decode CUDA graph end. elapsed={GRAPH_CAPTURE_S:.2f} s, "
                 f"mem usage=0.50 GB, avail mem={avail - 0.5:.2f} GB.")
    lines.append(
        f"max_total_num_tokens={plan.max_total_num_tokens}, chunked_prefill_size="
        f"{plan.chunked_prefill_size}, max_prefill_tokens=16384, max_running_requests="
        f"{plan.max_running_requests}, context_len={plan.context_len}, "
        f"available_gpu_mem={avail:.2f} GB")
    return lines


def first_start_here(cfg: SimConfig) -> bool:
    """Whether no server started on this port before (faults.start_marker_dir; True without
    one), marking that one has now."""
    if not cfg.faults.start_marker_dir:
        return True
    marker = Path(cfg.faults.start_marker_dir) / f"started-{cfg.port}"
    if marker.exists():
        return False
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("")
    return True


def injected_start_failure(faults: Faults, mem_fraction_static: float, total_mib: float,
                           first_start: bool) -> tuple[str, str] | None:
    """(message, exception type) of the start failure a fault asks for, as SGLang logs it."""
    why = faults.fail_start if first_start else (faults.fail_start or faults.fail_restart)
    oom_above = faults.oom_above_mem_fraction
    if why == "oom" or (oom_above is not None and mem_fraction_static > oom_above):
        return (f"CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                f"of {total_mib / 1024:.2f} GiB", "torch.OutOfMemoryError")
    if why == "error":
        return "simulated startup failure (fault injection)", "RuntimeError"
    return None


def degraded_speed(cfg: SimConfig, first_start: bool) -> float:
    """1.0, or the `degraded_speed` fault's factor on this port's first start."""
    f = cfg.faults
    if cfg.port not in f.degraded_ports or not f.start_marker_dir or not first_start:
        return 1.0
    return f.degraded_speed
