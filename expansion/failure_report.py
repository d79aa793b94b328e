"""The `error:` block a failed run ends with: what happened to which servers, what SGLang said
(its crash lines, collapsed: infra/sglang/crash_lines.py), where the logs are, what is safe,
and advice that is true for the cause — one screen, instead of a traceback.
"""

from __future__ import annotations

from pathlib import Path

from infra.sglang.crash_lines import Cause, CrashLine, crash_lines, main_cause

LOG_WINDOW = 256 * 1024  # a server log of a long job runs to gigabytes: read its end
ADVICE: dict[tuple[str, Cause], str] = {
    ("cannot_serve", "kernel_fault"): (
        "the servers start but die on any batch (a kernel fault, not a row): the same flags "
        "fail the same way — check the SGLang build and the driver, or change the kernel "
        "backends (--attention-backend, --moe-runner-backend, --linear-attn-backend) before "
        "running again; that run stops at its first deaths if nothing changed"),
    ("cannot_serve", "out_of_memory"): (
        "the servers run out of GPU memory on their first batch: lower "
        "server.mem_fraction_static or server.max_running_requests, or raise "
        "--cuda-graph-max-bs to the cap (eager batches allocate what the pools left no room "
        "for) before running again"),
    ("fleet_down", "out_of_memory"): (
        "the servers ran out of GPU memory mid-run: lower server.mem_fraction_static or "
        "server.max_running_requests (or raise --cuda-graph-max-bs to the cap), then run the "
        "same command to resume"),
    ("fleet_down", "kernel_fault"): (
        "the servers died of a kernel fault mid-run: if one row's input does it, the suspects' "
        "lane finds it on the next run; else check the build and the kernel backends, then run "
        "the same command to resume"),
    ("start_failed", "out_of_memory"): (
        "the pools do not fit the GPU: raise server.mem_fraction_static, or lower "
        "server.max_running_requests or the mamba share (`expansion plan` shows what fits), "
        "then run again"),
}
DEFAULT_ADVICE = {
    "start_failed": "fix what SGLang names above (a flag, the model path, the environment), "
                    "then run the same command: nothing was lost",
    "cannot_serve": "the servers cannot run a batch with these flags: read their logs above "
                    "and change what they name before running again",
    "fleet_down": "every server stopped answering: read their logs above, fix what they name "
                  "(or the servers' host), then run the same command to resume",
}
TITLES = {"cannot_serve": "the fleet cannot serve", "fleet_down": "the fleet went down",
          "start_failed": "a server failed to start"}


def server_crashes(output: Path) -> dict[Path, list[CrashLine]]:
    """Each server log in the output folder with the crash lines its end holds."""
    found = {}
    for log in sorted((output / "servers").glob("*.log")):
        try:
            with log.open("rb") as f:
                f.seek(max(0, f.seek(0, 2) - LOG_WINDOW))
                text = f.read().decode(errors="replace")
        except OSError:
            continue
        lines = crash_lines(text)
        if lines:
            found[log] = lines
    return found


def failure_block(kind: str, message: str, output: Path) -> list[str]:
    """The lines to print, `error:` first (kind: cannot_serve | fleet_down)."""
    from infra.manifest import Manifest

    crashes = server_crashes(output)
    what = message.splitlines()[0].split("; its log ")[0].removesuffix(":")
    lines = [f"error: {TITLES.get(kind, kind)}: {what}"]
    by_words: dict[tuple[str, ...], list[str]] = {}  # logs that said the same, together
    for log, said in crashes.items():
        by_words.setdefault(tuple(str(c) for c in said[:2]), []).append(log.name)
    for words, logs in by_words.items():
        lines.append(f"  {', '.join(logs)}: SGLang said")
        lines += [f"    {w}" for w in words]
    lines.append(f"  logs: {output / 'servers'}")
    manifest = Manifest(output)
    try:
        total = manifest.load_plan().num_shards
        committed = len(manifest.committed())
        lines.append(f"  safe: {committed} shard(s) committed in {output}; "
                     f"{total - committed} pending, nothing lost"
                     + (" (no row was blamed)" if kind == "cannot_serve" else ""))
    except (FileNotFoundError, ValueError):
        lines.append(f"  safe: nothing was committed in {output} yet")
    cause = main_cause([c for said in crashes.values() for c in said])
    lines.append("  advice: " + ADVICE.get((kind, cause), DEFAULT_ADVICE.get(kind, "")))
    return lines
