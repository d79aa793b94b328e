"""Measure what each server actually got (pools and caps) and compare with the memory model.

The seeds grepped one GPU's log for `max_running_requests`; we ask every server, because a
GPU unlike the others (another process on it, other memory) shows up only there.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.sglang.client import ServerAnswerError, get_server_info
from infra.sglang.memory import MemoryPlan
from infra.sglang.server_info import parse_server_info
from tasks.local_servers import ServerHandle


@dataclass(frozen=True)
class Capacity:
    """One server's measured capacity, from its /server_info."""

    index: int
    url: str
    version: str | None
    max_running_requests: int
    max_total_num_tokens: int
    max_mamba_cache_size: int | None
    context_len: int | None
    fingerprint: str  # of the server flags it runs (the output rows' `config` column)


def measure_one(handle: ServerHandle, api_key: str | None) -> Capacity:
    body = get_server_info(handle.url, api_key)
    info = parse_server_info(body)
    if info.max_running_requests is None or info.max_total_num_tokens is None:
        raise ServerAnswerError(
            f"{handle.url}/server_info lacks max_running_requests or max_total_num_tokens; "
            "is this an SGLang server that finished starting?")
    return Capacity(handle.index, handle.url, info.version, info.max_running_requests,
                    info.max_total_num_tokens, info.max_mamba_cache_size, info.context_len,
                    handle.fingerprint)


def client_limit(cap: Capacity, configured: int | None, queue_target: int) -> int:
    """In-flight requests to keep at a server: its running cap plus a small queue."""
    if configured is not None:
        return configured
    return max(1, cap.max_running_requests + queue_target)


def capacity_note(plan: MemoryPlan | None, capacities: list[Capacity]) -> str:
    """One or two sentences: what binds concurrency, and whether the servers agree."""
    if plan is None or not capacities:
        return ""
    distinct_caps = sorted({c.max_running_requests for c in capacities})
    note = (f"concurrency cap {'/'.join(map(str, distinct_caps))} per server; the memory model "
            f"predicts {plan.max_running_requests}, bound by the {plan.binding_limit} pool")
    if plan.binding_limit == "mamba":
        note += (f" ({plan.mamba_slots} mamba slots / {plan.slot_ratio} per request under "
                 f"{plan.mamba_strategy}; KV holds {plan.max_total_num_tokens} tokens) — see "
                 "`expansion plan` for the alternatives")
    if len(distinct_caps) > 1:
        note += "; servers differ: one GPU is not like the others"
    return note + "."
