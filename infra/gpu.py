"""GPU memory as nvidia-smi reports it: after stopping SGLang, wait until it is really freed.

A relaunch onto a GPU whose memory is still held (a zombie scheduler, a slow CUDA teardown)
would size its pools from what is left and come up with a smaller cap — or OOM.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Sequence


def memory_used_mib(gpus: Sequence[int]) -> dict[int, int] | None:
    """Used MiB per GPU index, or None where nvidia-smi is not available."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=index,memory.used",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    used: dict[int, int] = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            used[int(parts[0])] = int(parts[1])
    return {g: used[g] for g in gpus if g in used}


def wait_memory_released(gpus: Sequence[int], threshold_mib: int = 1024,
                         timeout_s: float = 60.0, poll_s: float = 1.0) -> dict[int, int]:
    """GPUs still holding more than `threshold_mib` after the timeout (empty: all free, or
    no nvidia-smi to ask)."""
    deadline = time.monotonic() + timeout_s
    while True:
        used = memory_used_mib(gpus)
        if used is None:
            return {}
        busy = {g: m for g, m in used.items() if m > threshold_mib}
        if not busy or time.monotonic() > deadline:
            return busy
        time.sleep(poll_s)
