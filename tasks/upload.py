"""Copy committed shards to the destination, then the manifest last.

Idempotent: a shard already at the destination with the same sha256 is skipped, so uploading
after every resume costs only the new shards. The destination here is a folder; object
storage plugs in behind the same `Destination` shape.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from prefect import task

from infra.ledger import Ledger, file_sha256


class Destination(Protocol):
    def has(self, key: str, sha256: str) -> bool: ...
    def put(self, source: Path, key: str) -> None: ...


@dataclass(frozen=True)
class FolderDestination:
    """A local (or mounted) folder."""

    root: Path

    def has(self, key: str, sha256: str) -> bool:
        target = self.root / key
        return target.is_file() and file_sha256(target) == sha256

    def put(self, source: Path, key: str) -> None:
        target = self.root / key
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        shutil.copyfile(source, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, target)


@dataclass(frozen=True)
class UploadReport:
    uploaded: int
    skipped: int
    destination: str


def destination_for(target: str) -> FolderDestination:
    if "://" in target and not target.startswith("file://"):
        raise ValueError(f"upload_to: {target!r}: only folders are supported by this build; "
                         "give a local path")
    return FolderDestination(Path(target.removeprefix("file://")))


def upload_committed(output: Path, target: str) -> UploadReport:
    ledger = Ledger(output)
    dest = destination_for(target)
    uploaded = skipped = 0
    for entry in sorted(ledger.committed().values(), key=lambda e: e.shard):
        keys = [(entry.path, entry.sha256)]
        if entry.error_path:
            keys.append((entry.error_path, file_sha256(output / entry.error_path)))
        for key, digest in keys:
            if dest.has(key, digest):
                skipped += 1
            else:
                dest.put(output / key, key)
                uploaded += 1
    for name in ("plan.json", "manifest.jsonl"):  # the manifest last: it vouches for shards
        if (output / name).is_file():
            dest.put(output / name, name)
    return UploadReport(uploaded, skipped, str(dest.root))


@task(name="upload", retries=3, retry_delay_seconds=[2, 8, 30])
def upload(output: str, target: str) -> UploadReport:
    return upload_committed(Path(output), target)
