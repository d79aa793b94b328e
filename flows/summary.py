"""The end-of-run summary as people read it: one block, the same in the flow log, the CLI
and the run report.

On the simulator the wall-clock rate is `time_scale` times what the modeled GPUs would do
(the simulator runs its GPU time faster than real time), so both figures are given and the
factor is said in words; on real SGLang there is one clock.
"""

from __future__ import annotations

from typing import Any


def summary_lines(summary: dict[str, Any]) -> list[str]:
    lines = [
        f"prompts: {summary['prompts_done_this_run']:,} done this run "
        f"({summary['errors_this_run']:,} errors, {summary['already_committed']:,} committed "
        f"before) of {summary['prompts_total']:,} planned",
        f"output: {summary['output_tokens']:,} tokens in {summary['seconds']:,} s of wall "
        f"clock = {summary['tok_s']:,} tok/s",
    ]
    scale = summary.get("time_scale", 1.0)
    if scale != 1.0:
        lines.append(
            f"simulated fleet: time_scale {scale:g} (the simulator runs {scale:g}× faster than "
            f"the GPUs it models), so in modeled GPU time that is "
            f"{summary['tok_s_modeled_gpu_time']:,} tok/s — what the same fleet would do on "
            "the real hardware")
    caps = sorted({s["max_running_requests"] for s in summary["servers"]})
    if caps:
        lines.append(f"servers: {len(summary['servers'])}, concurrency cap "
                     f"{'/'.join(map(str, caps))} each")
    if summary.get("capacity_note"):
        lines.append(f"capacity: {summary['capacity_note']}")
    lines.append(f"restarts: {summary['restarts']}" + "".join(
        f"; epoch {c['epoch']}: {c['diagnosis']} → {c.get('new_flags', {}).get('mamba_strategy')}"
        for c in summary.get("cycles", [])))
    lines.append(f"output folder: {summary['output']}")
    return lines


def format_summary(summary: dict[str, Any]) -> str:
    """The multi-line block for logs: a title line, then one fact per line."""
    return "run summary\n" + "\n".join(f"  {line}" for line in summary_lines(summary))
