"""Read `/server_info` (`/get_server_info`) bodies of every SGLang version we have seen.

The effective values live in `internal_states[0]` on newer builds (the top level keeps the
requested ones); older builds only have the top level. An absent field is None, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ServerInfo:
    version: str | None
    max_total_num_tokens: int | None
    max_running_requests: int | None  # effective per DP worker when the server says so
    max_mamba_cache_size: int | None
    context_len: int | None
    mem_fraction_static: float | None
    mamba_strategy: str | None
    last_gen_throughput: float | None


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def parse_server_info(body: dict[str, Any]) -> ServerInfo:
    states = body.get("internal_states")
    state: dict[str, Any] = states[0] if isinstance(states, list) and states and isinstance(
        states[0], dict) else {}

    def pick(*keys: str) -> Any:
        for source in (state, body):
            for key in keys:
                if source.get(key) is not None:
                    return source[key]
        return None

    running = pick("effective_max_running_requests_per_dp", "max_running_requests")
    strategy = pick("mamba_radix_cache_strategy", "mamba_scheduler_strategy")
    return ServerInfo(
        version=str(body["version"]) if body.get("version") is not None else None,
        max_total_num_tokens=_int(pick("max_total_num_tokens")),
        max_running_requests=_int(running),
        max_mamba_cache_size=_int(pick("max_mamba_cache_size")),
        context_len=_int(pick("context_len", "context_length")),
        mem_fraction_static=_float(pick("mem_fraction_static")),
        mamba_strategy=str(strategy) if strategy is not None else None,
        last_gen_throughput=_float(pick("last_gen_throughput")),
    )
