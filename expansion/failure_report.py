"""The `error:` block a failed run ends with: what happened to which servers, what SGLang said
(its crash lines, collapsed: infra/sglang/crash_lines.py), where the logs are, what is safe,
and advice that is true for the cause — one screen, instead of a traceback.
"""

from __future__ import annotations

from pathlib import Path

from infra.sglang.crash_lines import Cause, CrashLine, crash_lines, main_cause
from infra.sglang.observe import READY_LINE

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
RELAUNCH_FAILED_ADVICE = (
    "the servers died mid-run and their relaunches failed to start (their .relaunch logs "
    "above): the GPUs or the host are in a bad state — check nvidia-smi and the driver, or "
    "free the GPUs, then run the same command to resume")
DEFAULT_ADVICE = {
    "output_unwritable": "make room on that disk (or raise the quota, or move the output "
                         "folder to a larger disk and point --output at it), then run the "
                         "same command to resume: a half-written shard is written again",
    "output_taken_over": "another run owns this output folder now and finishes the job; "
                         "this run's committed shards are in its manifest: nothing to do "
                         "here",
    "bucket_unreachable": "check storage.endpoint_url, the credentials and the network path "
                          "to the bucket, then run the same command: it uploads what the "
                          "bucket lacks and generates nothing again",
    "start_failed": "fix what SGLang names above (a flag, the model path, the environment), "
                    "then run the same command: nothing was lost",
    "cannot_serve": "the servers cannot run a batch with these flags: read their logs above "
                    "and change what they name before running again",
    "fleet_down": "every server stopped answering: read their logs above, fix what they name "
                  "(or the servers' host), then run the same command to resume",
}
TITLES = {"cannot_serve": "the fleet cannot serve", "fleet_down": "the fleet went down",
          "start_failed": "a server failed to start",
          "output_unwritable": "the output's disk refused a write",
          "output_taken_over": "the output folder was taken over",
          "bucket_unreachable": "the bucket could not be reached"}


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
    """The lines to print, `error:` first (kind: a RunEnd's kind, or start_failed)."""
    crashes = {} if kind == "bucket_unreachable" else server_crashes(output)
    what = message.splitlines()[0].split("; its log ")[0].removesuffix(":")
    lines = [f"error: {TITLES.get(kind, kind)}: {what}"]
    if kind == "output_unwritable":
        from tasks.run_ends import free_space_note

        lines.append(f"  disk: {free_space_note(output)}")
    by_words: dict[tuple[str, ...], list[str]] = {}  # logs that said the same, together
    for log, said in crashes.items():
        by_words.setdefault(tuple(str(c) for c in said[:2]), []).append(log.name)
    for words, logs in by_words.items():
        lines.append(f"  {', '.join(logs)}: SGLang said")
        lines += [f"    {w}" for w in words]
    if kind != "bucket_unreachable":
        lines.append(f"  logs: {output / 'servers'}")
    lines.append(safe_line(kind, output))
    return [*lines, "  advice: " + advice(kind, crashes)]


def safe_line(kind: str, output: Path) -> str:
    """What the output folder's manifest holds: committed and pending shards."""
    from infra.manifest import Manifest

    manifest = Manifest(output)
    try:
        total = manifest.load_plan().num_shards
        committed = len(manifest.committed())
    except (FileNotFoundError, ValueError):
        return f"  safe: nothing was committed in {output} yet"
    return (f"  safe: {committed} shard(s) committed in {output}; {total - committed} "
            "pending, nothing lost" + (" (no row was blamed)" if kind == "cannot_serve" else ""))


def came_up(log: Path) -> bool:
    """Whether the server of this log got ready (SGLang's ready line is among its first)."""
    try:
        with log.open("rb") as f:
            return READY_LINE.encode() in f.read(LOG_WINDOW)
    except OSError:
        return False


def advice(kind: str, crashes: dict[Path, list[CrashLine]]) -> str:
    """The advice true for this end: relaunches that failed to start say the host is bad;
    else by what the servers' logs name as the cause."""
    if kind == "fleet_down" and any(".relaunch" in log.name and not came_up(log)
                                    for log in crashes):
        return RELAUNCH_FAILED_ADVICE
    cause = main_cause([c for said in crashes.values() for c in said])
    return ADVICE.get((kind, cause), DEFAULT_ADVICE.get(kind, ""))
