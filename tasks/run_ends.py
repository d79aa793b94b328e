"""The ways a run ends in failure that leave nothing lost: the fleet went down, the output's
disk refused a write, the bucket could not be reached. Each is raised where it is seen and
reaches the CLI whole, which prints the `error:` block for its kind
(expansion/failure_report.py) instead of a traceback: what happened, what is safe, and advice
true for the cause. (A fleet that cannot serve is told in tasks/first_batch.py; a server that
fails to start in tasks/health.py.)
"""

from __future__ import annotations

import contextlib
import errno
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

# The errors of a disk that cannot take more, not of a bug: full, over quota, read-only, or a
# file past the size limit (ulimit -f).
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})


class RunEnd(RuntimeError):
    """A failure the run ends on cleanly: committed shards are safe, the rest resume."""

    kind: ClassVar[str] = "run_end"


class FleetDown(RunEnd):
    """Every server stopped answering; committed shards are safe, the rest resume later."""

    kind = "fleet_down"


class OutputUnwritable(RunEnd):
    """The output folder's disk refused a write (full, over quota, read-only)."""

    kind = "output_unwritable"

    def __init__(self, message: str, folder: Path) -> None:
        super().__init__(message)
        self.folder = folder


class OutputTakenOver(RunEnd):
    """Another run took this run's output folder (`--force-takeover`): it writes no more."""

    kind = "output_taken_over"


class BucketUnreachable(RunEnd):
    """The final upload failed after its retries; every shard is committed locally."""

    kind = "bucket_unreachable"


def free_space_note(folder: Path) -> str:
    """'<free> free of <total> on the disk holding <folder>', as df would say it."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        usage = shutil.disk_usage(probe)
    except OSError as exc:
        return f"the disk holding {folder} cannot be read ({exc.strerror})"
    return (f"{_size(usage.free)} free of {_size(usage.total)} on the disk holding {folder}")


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


@contextlib.contextmanager
def writing_output(what: str, folder: Path) -> Iterator[None]:
    """Turn a disk's refusal while writing `what` into OutputUnwritable (any other OSError is
    a bug or a missing file, and stays what it is)."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in DISK_ERRNOS:
            raise
        raise OutputUnwritable(f"writing {what} to {folder}: [Errno {exc.errno}] "
                               f"{exc.strerror}", folder) from exc
