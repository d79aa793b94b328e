"""What a dead SGLang server said: its crash lines, collapsed, and the cause they name.

SGLang's scheduler dies the same way in every release since 0.3: `Scheduler hit an exception:`
and a Python traceback ending in the error (a CUDA error, `torch.OutOfMemoryError`, an
AssertionError), often after a flood of identical device-side asserts (192 in the real 0.5.17
sample, `tests/fixtures/sglang-samples/crash-first-batch-0.5.17.log`); then the parent logs
`SIGQUIT received` (0.5.x; older: `Received sigquit from a child process`) and exits. A hang
ends in the watchdog instead (`Watchdog timeout`, `watchdog_timeout`). The key lines are the
first line of each distinct failure, counted, so a person reads two lines, not 289.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Cause = Literal["out_of_memory", "kernel_fault", "hang", "exception", "none"]

_STAMP = re.compile(r"^\[[^\]]*\]\s*")  # SGLang's `[2026-12-03 13:37:18]` (and TP-rank) prefix
_NUMBERS = re.compile(r"\d+")
_KEY = [  # (cause, pattern) — first match wins; order: most specific first
    ("out_of_memory", re.compile(r"OutOfMemoryError: |CUDA out of memory")),
    ("kernel_fault", re.compile(r"Assertion `.*` failed|device-side assert|CUDA error|"
                                r"CUBLAS_STATUS|illegal memory access|NCCL error")),
    ("hang", re.compile(r"[Ww]atchdog (timeout|timed out)|watchdog_timeout")),
    ("exception", re.compile(r"^(\w+\.)*\w*(Error|Exception): |"
                             r"Scheduler hit an exception: (?!Traceback)\S")),
]
_CONTEXT = re.compile(r"SIGQUIT received|Received sigquit|Scheduler hit an exception")


@dataclass(frozen=True)
class CrashLine:
    text: str  # the first occurrence, without its time stamp
    count: int  # how many lines of this shape (numbers aside) the log holds
    cause: Cause

    def __str__(self) -> str:
        return f"{self.text} (×{self.count})" if self.count > 1 else self.text


def crash_lines(log_text: str, limit: int = 4) -> list[CrashLine]:
    """The log's distinct failure lines in order of first appearance (at most `limit`)."""
    found: dict[str, CrashLine] = {}
    for raw in log_text.splitlines():
        line = _STAMP.sub("", raw.strip())
        if line.startswith("server_args="):  # every flag's name and value: not a failure
            continue
        cause = _cause(line)
        if cause is None:
            continue
        shape = _NUMBERS.sub("#", line)
        if shape in found:
            old = found[shape]
            found[shape] = CrashLine(old.text, old.count + 1, old.cause)
        else:
            found[shape] = CrashLine(line[:300], 1, cause)
    return list(found.values())[:limit]


def _cause(line: str) -> Cause | None:
    for cause, pattern in _KEY:
        if pattern.search(line):
            return cause  # type: ignore[return-value]
    return None


def died(log_text: str) -> bool:
    """Whether the log shows the server's scheduler dying (or being killed for a hang)."""
    return bool(_CONTEXT.search(log_text)) or any(
        c.cause in ("out_of_memory", "kernel_fault", "hang") for c in crash_lines(log_text))


def main_cause(lines: list[CrashLine]) -> Cause:
    """The cause the advice is for: memory over kernels over hangs over anything else."""
    order: tuple[Cause, ...] = ("out_of_memory", "kernel_fault", "hang", "exception")
    return next((cause for cause in order if any(c.cause == cause for c in lines)), "none")
