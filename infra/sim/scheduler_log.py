"""The scheduler's log lines, worded as SGLang 0.5.17 words them (scheduler.py's
log_prefill_stats / log_decode_stats, update_running_batch's retraction line), so that
`expansion inspect`, the monitor and the diagnosis read the simulator's log as they read a
real server's."""

from __future__ import annotations

from infra.sim.metrics import EngineStats


def usage_part(stats: EngineStats, kv_usage: float, mamba_usage: float | None,
               decode: bool) -> str:
    """The pool part of a line: one pool on a dense model, full + mamba on a hybrid."""
    if mamba_usage is None:
        return (f"#token: {stats.kv_used_tokens}, token usage: {kv_usage:.2f}"
                if decode else f"token usage: {kv_usage:.2f}")
    if decode:
        return (f"#full token: {stats.kv_used_tokens}, full token usage: {kv_usage:.2f}, "
                f"mamba num: {stats.mamba_used}, mamba usage: {mamba_usage:.2f}")
    return f"full token usage: {kv_usage:.2f}, mamba usage: {mamba_usage:.2f}"


def prefill_line(stats: EngineStats, usage: str, admitted: int, tokens: int,
                 cached: int, pending: int, throughput: float) -> str:
    return (f"Prefill batch, #new-seq: {admitted}, #new-token: {tokens}, "
            f"#cached-token: {cached}, {usage}, "
            f"#running-req: {stats.running}, #queue-req: {stats.queued}, "
            f"#pending-token: {pending}, cuda graph: False, "
            f"input throughput (token/s): {throughput:.2f}")


def decode_line(stats: EngineStats, usage: str, running: int, queued: int, graph: bool,
                spec: str) -> str:
    return (f"Decode batch, #running-req: {running}, {usage}, "
            f"{spec}cuda graph: {graph}, gen throughput (token/s): "
            f"{stats.gen_throughput:.2f}, #queue-req: {queued}")


def retract_line(retracted: int, tokens_gained: int, mamba_gained: int | None,
                 old_ratio: float, new_ratio: float) -> str:
    """0.5.17's line when decode takes requests back; the mamba slots only on a hybrid."""
    mamba = f", #mamba_num_gained: {mamba_gained}" if mamba_gained is not None else ""
    return (f"KV cache pool is full. Retract requests. #retracted_reqs: {retracted}"
            f", #new_tokens_gained: {tokens_gained}{mamba}"
            f", #new_token_ratio: {old_ratio:.4f} -> {new_ratio:.4f}")
