"""The output folder's manifest, the job's only record of what is done: plan, shards, manifest.

Layout under the output root:
  plan.json               the shard plan, fixed at the first run, fingerprinted
  manifest.jsonl          one line per committed shard (append-only, fsynced)
  shards/shard-NNNNNN.parquet   completions
  errors/shard-NNNNNN.parquet   prompts that failed permanently, with the reason
  servers/                server logs and the registry of server processes
A shard is written to a temp file, fsynced, renamed, then recorded in the manifest: a shard
file without a manifest line is not committed (and is rewritten on resume); a manifest line
always points at a complete file. Resume = plan minus manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import polars as pl

from infra.files import atomic_write, read_jsonl
from infra.output_row import ERRORS, GENERATED, parquet_bytes
from infra.prompts import InputSummary

PLAN_VERSION = 1


class PlanMismatch(ValueError):
    """The output folder belongs to another input or shard size."""


@dataclass(frozen=True)
class ShardPlan:
    input_path: str
    input_rows: int
    ids_sha256: str
    shard_size: int
    num_shards: int
    version: int = PLAN_VERSION
    id_dtype: str = "String"  # the input id's type, kept in the output (older plans: String)
    input_kind: str = ""  # prompt | messages | input_ids: what an export answers as ("": older)

    @property
    def fingerprint(self) -> str:
        blob = f"{self.ids_sha256}:{self.input_rows}:{self.shard_size}:{self.version}"
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def rows_of(self, shard: int) -> tuple[int, int]:
        start = shard * self.shard_size
        return start, min(start + self.shard_size, self.input_rows)


@dataclass(frozen=True)
class ManifestEntry:
    shard: int
    rows: int
    errors: int
    first_id: str
    last_id: str
    sha256: str
    path: str
    error_path: str | None
    output_tokens: int
    plan: str  # the shard plan's fingerprint (the on-disk field name manifests carry)
    committed_at: float
    prompt_tokens: int = 0  # what the shard's prompts held, and what the prefix cache reused
    cached_tokens: int = 0  # (manifests written before these fields read as 0)


def make_plan(summary: InputSummary, shard_size: int) -> ShardPlan:
    shards = -(-summary.rows // shard_size)
    return ShardPlan(summary.path, summary.rows, summary.ids_sha256, shard_size, shards,
                     id_dtype=summary.id_dtype, input_kind=summary.kind)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Manifest:
    """Reads and writes the output layout above."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.plan_path = root / "plan.json"
        self.manifest_path = root / "manifest.jsonl"
        self.shards_dir = root / "shards"
        self.errors_dir = root / "errors"
        self.servers_dir = root / "servers"

    def init_plan(self, shard_plan: ShardPlan) -> ShardPlan:
        """Write the shard plan on the first run; on later runs require the same one."""
        for folder in (self.root, self.shards_dir, self.errors_dir, self.servers_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self._repair_manifest_tail()
        if self.plan_path.is_file():
            existing = ShardPlan(**json.loads(self.plan_path.read_text()))
            if existing.fingerprint != shard_plan.fingerprint:
                raise PlanMismatch(
                    f"output: {self.root} holds a run over other input ({existing.input_path}, "
                    f"{existing.input_rows} rows, shard_size {existing.shard_size}); use a new "
                    "--output folder or the same prompts and shard_size")
            return existing
        atomic_write(self.plan_path, json.dumps(asdict(shard_plan), indent=1).encode(), fsync=True)
        return shard_plan

    def _repair_manifest_tail(self) -> None:
        """Cut a torn last line (a crash mid-append) so the next append starts clean."""
        if not self.manifest_path.is_file():
            return
        data = self.manifest_path.read_bytes()
        if data and not data.endswith(b"\n"):
            keep = data[: data.rfind(b"\n") + 1]
            with open(self.manifest_path, "r+b") as fh:
                fh.truncate(len(keep))
                fh.flush()
                os.fsync(fh.fileno())

    def load_plan(self) -> ShardPlan:
        if not self.plan_path.is_file():
            raise FileNotFoundError(f"{self.root} has no plan.json: not an expansion output")
        return ShardPlan(**json.loads(self.plan_path.read_text()))

    def committed(self) -> dict[int, ManifestEntry]:
        """Manifest entries by shard. A torn last line (crash mid-append) is ignored."""
        return {e.shard: e for e in read_jsonl(self.manifest_path, ManifestEntry)}

    def remove_strays(self) -> list[Path]:
        """Delete temp files and shard files that never reached the manifest."""
        committed = self.committed()
        keep = {e.path for e in committed.values()} | {
            e.error_path for e in committed.values() if e.error_path}
        removed = []
        for folder in (self.shards_dir, self.errors_dir):
            for path in folder.glob("*"):
                rel = str(path.relative_to(self.root))
                if path.name.startswith(".") or rel not in keep:
                    path.unlink()
                    removed.append(path)
        return removed

    def commit_shard(self, shard_plan: ShardPlan, shard: int, rows: list[dict[str, Any]],
                     errors: list[dict[str, Any]]) -> ManifestEntry:
        """Write the shard (and its error rows) atomically, then append to the manifest."""
        import time

        name = f"shard-{shard:06d}.parquet"
        path = self.shards_dir / name
        atomic_write(path, parquet_bytes(rows, GENERATED), fsync=True)
        error_rel = None
        if errors:
            atomic_write(self.errors_dir / name, parquet_bytes(errors, ERRORS), fsync=True)
            error_rel = f"errors/{name}"
        ids = [r["id"] for r in rows] + [e["id"] for e in errors]
        entry = ManifestEntry(
            shard=shard, rows=len(rows), errors=len(errors),
            first_id=str(ids[0]) if ids else "", last_id=str(ids[-1]) if ids else "",
            sha256=file_sha256(path), path=f"shards/{name}", error_path=error_rel,
            output_tokens=sum(int(r.get("completion_tokens") or 0) for r in rows),
            plan=shard_plan.fingerprint, committed_at=time.time(),
            prompt_tokens=sum(int(r.get("prompt_tokens") or 0) for r in rows),
            cached_tokens=sum(int(r.get("cached_tokens") or 0) for r in rows),
        )
        line = json.dumps(asdict(entry)) + "\n"
        with open(self.manifest_path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        return entry

    def read_completions(self) -> pl.DataFrame:
        files = [self.root / e.path for e in sorted(self.committed().values(),
                                                    key=lambda e: e.shard) if e.rows]
        if not files:
            return pl.DataFrame()
        return pl.concat([pl.read_parquet(f) for f in files], how="diagonal_relaxed")
