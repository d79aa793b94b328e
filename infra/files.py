"""The two file habits every ledger of the job shares, written once.

`atomic_write`: readers see the old file or the new one, never half of one (temp file in the
same folder, then rename); with `fsync`, the bytes and the rename also survive a power loss.
`read_jsonl`: one record per line, where a line that does not parse — the torn tail of a
crash mid-append — is skipped, not fatal.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, fsync: bool = False) -> None:
    """Write through a temporary file renamed over `path`: a reader sees the old file or the
    whole new one. A write the disk refuses removes its temporary (on a full disk it holds
    the space the next try needs)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    if fsync:
        fsync_dir(path.parent)


def parse_jsonl(lines: Iterable[str | bytes], record: Callable[..., T]) -> list[T]:
    """`record(**obj)` for each line that is a JSON object of the right fields."""
    out = []
    for line in lines:
        try:
            fields: Any = json.loads(line)
            out.append(record(**fields))
        except (json.JSONDecodeError, TypeError, UnicodeDecodeError):
            continue
    return out


def read_jsonl(path: Path, record: Callable[..., T]) -> list[T]:
    if not path.is_file():
        return []
    with open(path, "rb") as fh:
        return parse_jsonl(fh, record)
