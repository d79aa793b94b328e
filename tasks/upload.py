"""Upload committed shards as they commit (the manifest republished after each), then a final
verified pass with the manifest last.

Idempotent: an object whose stored sha256 equals the local file's is skipped, so uploading
after every resume costs only new shards, and a shard interrupted mid-upload is simply sent
again. A manifest line is written only after its shard, so a reader never sees a manifest
line whose shard is not there yet.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from infra.files import parse_jsonl
from infra.manifest import Manifest, ManifestEntry, file_sha256
from infra.storage import Destination, StorageError, open_destination

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UploadReport:
    uploaded: int
    skipped: int
    destination: str


def _entry_files(output: Path, entry: ManifestEntry) -> list[tuple[str, str]]:
    files = [(entry.path, entry.sha256)]
    if entry.error_path:
        files.append((entry.error_path, file_sha256(output / entry.error_path)))
    return files


def upload_entry(dest: Destination, output: Path, entry: ManifestEntry) -> tuple[int, int]:
    """(uploaded, skipped) for one committed shard."""
    uploaded = skipped = 0
    for key, digest in _entry_files(output, entry):
        if dest.sha256_of(key) == digest:
            skipped += 1
        else:
            dest.put(output / key, key, digest)
            uploaded += 1
    return uploaded, skipped


# What a run leaves besides shards, for whoever reads the bucket: how it went (report), what
# the tuner tried (manifest), the fleet's time series, and the servers' logs (secrets redacted
# when the servers stopped).
RECORD_FILES = ("report.md", "report.png", "tuning.jsonl", "monitor/*.parquet",
                "servers/*.log")


def upload_records(output: Path, dest: Destination, prefix: str = "") -> int:
    """Upload the run's records (RECORD_FILES) under `prefix`; skips what is there already."""
    count = 0
    for pattern in RECORD_FILES:
        for path in sorted(output.glob(pattern)):
            key = prefix + path.relative_to(output).as_posix()
            digest = file_sha256(path)
            if dest.sha256_of(key) != digest:
                dest.put(path, key, digest)
                count += 1
    return count


def upload_committed(output: Path, dest: Destination,
                     manifest_key: str = "manifest.jsonl",
                     records_prefix: str = "") -> UploadReport:
    """Make the destination hold every committed shard (verified by sha256), the run's
    records, then the manifest last.

    A node of a multi-node job publishes its manifest under its own key
    (`manifests/<node>.jsonl`) and its records under `nodes/<node>/`; the fleet flow merges
    the manifests."""
    manifest = Manifest(output)
    uploaded = skipped = 0
    for entry in sorted(manifest.committed().values(), key=lambda e: e.shard):
        up, skip = upload_entry(dest, output, entry)
        uploaded += up
        skipped += skip
    uploaded += upload_records(output, dest, records_prefix)
    for name, key in (("plan.json", "plan.json"), ("manifest.jsonl", manifest_key)):
        path = output / name
        if path.is_file():
            dest.put(path, key, file_sha256(path))
    return UploadReport(uploaded, skipped, dest.label)


def restore_from(dest: Destination, output: Path) -> int:
    """Fill an empty local output from the destination (plan, manifest, shards): a resume on a
    new machine. Returns the number of shards restored; 0 when the remote has nothing."""
    if (output / "plan.json").exists():
        return 0
    plan_bytes = dest.get_bytes("plan.json")
    entries = dest.get_bytes("manifest.jsonl")
    if plan_bytes is None or entries is None:
        return 0
    output.mkdir(parents=True, exist_ok=True)
    (output / "manifest.jsonl").write_bytes(entries)
    manifest = Manifest(output)
    restored = 0
    for entry in manifest.committed().values():
        for key, _ in [(entry.path, entry.sha256)] + ([(entry.error_path, "")]
                                                      if entry.error_path else []):
            data = dest.get_bytes(key)
            if data is None:
                raise StorageError(f"{dest.label}: manifest lists {key} but it is missing")
            target = output / key
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        if file_sha256(output / entry.path) != entry.sha256:
            raise StorageError(f"{dest.label}/{entry.path}: checksum differs from the manifest")
        restored += 1
    (output / "plan.json").write_bytes(plan_bytes)  # last: a half-restored folder has no plan
    return restored


class ShardUploader:
    """Uploads each shard in the background as it commits, then republishes the manifest —
    so the bucket is a complete record mid-run: a run whose node is lost resumes elsewhere
    from the bucket (restore_from) and regenerates only what the manifest lacks.

    One thread keeps the order: shard first, manifest line after, so a reader never sees an
    entry whose object is missing. The manifest starts from the remote one (what earlier runs
    published), read before the first shard is published. A node of a multi-node job
    publishes under its own key (`manifests/<node>.jsonl`); the fleet flow merges them.

    A bucket that stops answering costs the run nothing: after a failed upload the shards
    that commit wait (in order) for `pause_s`, then go together once it answers again, rather
    than each waiting out botocore's retries; what is still waiting at the end goes with the
    final pass."""

    def __init__(self, dest: Destination, output: Path,
                 manifest_key: str | None = None, pause_s: float = 60.0) -> None:
        self.dest = dest
        self.output = output
        self.manifest_key = manifest_key or "manifest.jsonl"
        self.pause_s = pause_s
        self._published: dict[int, ManifestEntry] | None = None  # None: not read yet
        self._waiting: list[ManifestEntry] = []
        self._paused_until = 0.0
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="upload")
        self._lock = threading.Lock()
        self._last_error: StorageError | None = None
        self._futures: list[Future[None]] = [self._pool.submit(self._send_waiting)]

    def _start(self) -> None:
        """The plan first (a restore needs it), then what the bucket already lists."""
        plan_file = self.output / "plan.json"
        if plan_file.is_file() and self.dest.sha256_of("plan.json") != file_sha256(plan_file):
            self.dest.put(plan_file, "plan.json", file_sha256(plan_file))
        remote = self.dest.get_bytes(self.manifest_key) or b""
        self._published = {e.shard: e for e in parse_jsonl(remote.splitlines(), ManifestEntry)}

    def submit(self, entry: ManifestEntry) -> None:
        with self._lock:
            self._futures.append(self._pool.submit(self._queue, entry))

    def _queue(self, entry: ManifestEntry) -> None:
        self._waiting.append(entry)
        self._send_waiting()

    def _send_waiting(self) -> None:
        """Publish what waits, oldest first, unless a recent failure paused uploads."""
        if time.monotonic() < self._paused_until:
            return
        try:
            if self._published is None:
                self._start()
            while self._waiting:
                self._send(self._waiting[0])
                self._waiting.pop(0)
        except StorageError as exc:
            if self._last_error is None:
                log.warning("upload to %s failed (%s); shards wait %.0f s at a time and go "
                            "when it answers, or with the final pass", self.dest.label, exc,
                            self.pause_s)
            self._last_error = exc
            self._paused_until = time.monotonic() + self.pause_s

    def _send(self, entry: ManifestEntry) -> None:
        upload_entry(self.dest, self.output, entry)
        published = self._published if self._published is not None else {}
        published[entry.shard] = entry
        lines = "".join(json.dumps(asdict(published[s])) + "\n" for s in sorted(published))
        self.dest.put_bytes(lines.encode(), self.manifest_key)

    @property
    def failures(self) -> int:
        """Shards not published mid-run (plus 1 if the bucket's manifest was never read)."""
        return len(self._waiting) + (self._published is None)

    def close(self) -> int:
        """Wait for uploads in flight; return how many are left for the final pass. (A bug in
        an upload is logged here with its traceback: the thread has no one else to tell.)"""
        self._pool.shutdown(wait=True)
        for fut in self._futures:
            exc = fut.exception()
            if exc is not None:
                log.error("a shard upload broke; the final pass uploads it", exc_info=exc)
        return self.failures


def merge_manifests(dest: Destination) -> list[ManifestEntry]:
    """One manifest from the root manifest and every node's: each shard once (the earliest
    commit wins; a later duplicate from a node thought dead wrote the very same object key).
    Written to the root `manifest.jsonl` of the destination."""
    by_shard: dict[int, ManifestEntry] = {}
    keys = ["manifest.jsonl", *[k for k in dest.list_keys("manifests/") if
                                k.endswith(".jsonl")]]
    for key in keys:
        for entry in parse_jsonl((dest.get_bytes(key) or b"").splitlines(), ManifestEntry):
            old = by_shard.get(entry.shard)
            if old is None or entry.committed_at < old.committed_at:
                by_shard[entry.shard] = entry
    merged = [by_shard[s] for s in sorted(by_shard)]
    dest.put_bytes("".join(json.dumps(asdict(e)) + "\n" for e in merged).encode(),
                   "manifest.jsonl")
    return merged


@task(name="upload", cache_policy=NO_CACHE, retries=4,
      retry_delay_seconds=[2, 8, 30, 60])
def upload(output: str, target: str, endpoint_url: str | None = None,
           region: str | None = None, manifest_key: str = "manifest.jsonl",
           multipart_mb: int = 64, records_prefix: str = "") -> UploadReport:
    """The final upload, with the same multipart size as the uploads during the run."""
    dest = open_destination(target, endpoint_url, region, multipart_mb)
    return upload_committed(Path(output), dest, manifest_key, records_prefix)
