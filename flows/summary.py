"""The end-of-run summary as people read it: one block, the same in the flow log, the CLI
and the run report.

On the simulator the wall-clock rate is `time_scale` times what the modeled GPUs would do
(the simulator runs its GPU time faster than real time), so both figures are given and the
factor is said in words; on real SGLang there is one clock.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class ServerSummary(BaseModel):
    url: str
    max_running_requests: int
    max_total_num_tokens: int | None
    max_mamba_cache_size: int | None


class RunSummary(BaseModel):
    """What a run did. The flow returns it as JSON (`model_dump()`), the form Prefect keeps
    as the run's result and a deployment's caller reads; code reads the fields."""

    model_config = ConfigDict(extra="forbid")

    output: str
    prompts_total: int
    prompts_done_this_run: int
    errors_this_run: int
    already_committed: int
    output_tokens: int
    seconds: float
    tok_s: float
    tok_s_modeled_gpu_time: float
    time_scale: float
    servers: list[ServerSummary]
    capacity_note: str
    restarts: int
    answers_redone_after_drains: int
    cycles: list[dict[str, Any]]  # tasks.tuning.cycles.Cycle.record(); the tuning-ledger artifact
    final_server_flags: dict[str, Any]
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, reused from the servers' prefix caches
    prefix_affinity_chars: int = 0
    client_concurrency: int | None = None  # client.concurrency_per_server, when set
    primers: int = 0  # groups whose shared prefix went first to a no_buffer server
    startup_s: float = 0.0  # wall seconds the fleets took to come up (all epochs)
    generating_s: float = 0.0  # wall seconds spent generating (all epochs)
    client_starved_s: float = 0.0  # wall seconds the run starved for a CPU (tasks/feed.py)
    advice: list[dict[str, Any]] = []  # engine=external: moves not made (tasks/tuning/advice.py)


def summary_lines(summary: RunSummary | dict[str, Any]) -> list[str]:
    s = summary if isinstance(summary, RunSummary) else RunSummary.model_validate(summary)
    lines = [
        f"prompts: {s.prompts_done_this_run:,} done this run ({s.errors_this_run:,} errors, "
        f"{s.already_committed:,} committed before) of {s.prompts_total:,} planned",
        f"output: {s.output_tokens:,} tokens in {s.seconds:,} s of wall clock = "
        f"{s.tok_s:,} tok/s",
    ]
    if s.generating_s > 0:
        lines.append(
            f"time: {s.startup_s:,.1f} s starting servers, {s.generating_s:,.1f} s generating "
            f"= {s.output_tokens / s.generating_s:,.1f} tok/s while generating")
    if s.client_starved_s > 0:
        lines.append(
            f"client machine: CPU-starved {s.client_starved_s:,.1f} s of {s.seconds:,} s (a "
            "thread of the run waited for a CPU ≥ 25 % of the time it could run); the tuner "
            "judged no window in which that left a server unfed")
    if s.time_scale != 1.0:
        lines.append(
            f"simulated fleet: time_scale {s.time_scale:g} (the simulator runs "
            f"{s.time_scale:g}× faster than the GPUs it models), so in modeled GPU time that "
            f"is {s.tok_s_modeled_gpu_time:,} tok/s — what the same fleet would do on the "
            "real hardware")
    distinct_caps = sorted({srv.max_running_requests for srv in s.servers})
    if distinct_caps:
        client = (f"; the client keeps {s.client_concurrency} in flight per server "
                  "(client.concurrency_per_server)" if s.client_concurrency else "")
        lines.append(f"servers: {len(s.servers)}, concurrency cap "
                     f"{'/'.join(map(str, distinct_caps))} each{client}")
    if s.capacity_note:
        lines.append(f"capacity: {s.capacity_note}")
    if s.prompt_tokens:
        lines.append(prefix_line(s))
    lines.append(f"tuning cycles: {s.restarts}" + "".join(f"; {cycle_line(c)}" for c in s.cycles))
    for advice in s.advice:
        lines.append(f"advice: {advice['diagnosis']} → relaunch the servers with "
                     f"{advice['launch_flags']} (predicted {advice['predicted_gain'] or 0:.2f}×;"
                     " engine=external: this job does not restart them)")
    lines.append(f"output folder: {s.output}")
    return lines


def prefix_line(s: RunSummary) -> str:
    """How much prefill the radix cache saved, and whether affinity routing was on."""
    share = s.cached_tokens / s.prompt_tokens
    how = (f"prefix affinity on (first {s.prefix_affinity_chars:,} characters)"
           if s.prefix_affinity_chars else "prefix affinity off")
    if s.primers:
        how += f"; {s.primers:,} groups primed (their shared prefix sent first: no_buffer)"
    return (f"prefix cache: {share:.1%} of {s.prompt_tokens:,} prompt tokens reused; {how}")


def cycle_line(c: dict[str, Any]) -> str:
    """One cycle in a few words: what was seen, what was tried, how it ended."""
    head = f"epoch {c['epoch']}: {c['diagnosis']}"
    canary = c.get("canary")
    if c.get("kind") == "restart-one":
        return f"{head} → {c['reason'].split(' ran ', 1)[0]} restarted alone (same config)"
    if c.get("kind") == "relaunch":
        server = c["reason"].split("'s process", 1)[0]
        return f"{head} → {server} died: relaunched alone (same config)"
    if not canary:
        return f"{head} → fleet restarted with {c.get('new_flags', {}).get('mamba_strategy')}"
    gain = canary.get("measured_gain")
    measured = f", measured {gain:.2f}×" if gain else ""
    predicted = canary.get("predicted_gain")
    promised = f" (predicted {predicted:.2f}×)" if predicted else ""
    return (f"{head} → canary on {', '.join(canary['canary_servers'])} "
            f"{canary['outcome'].replace('_', ' ')}{measured}{promised}, "
            f"{canary['server_restarts']} server restarts")


def format_summary(summary: RunSummary | dict[str, Any]) -> str:
    """The multi-line block for logs: a title line, then one fact per line."""
    return "run summary\n" + "\n".join(f"  {line}" for line in summary_lines(summary))
