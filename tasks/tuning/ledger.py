"""The tuning ledger: every configuration a job tried, what it measured, how it ended.

Append-only JSONL next to the output (`tuning.jsonl`), so a rerun never repeats a config
that failed or was slower, a rollback knows the best one so far, and the same command run
again after an interruption resumes on the configuration the job had moved to (`resume_point`)
instead of starting the tuning over from the user's flags.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from infra.files import read_jsonl
from infra.sglang.flags import ServerFlags
from tasks.fleet_config import FleetConfig

LedgerOutcome = Literal["measured", "failed", "rolled_back", "started"]
"""`started`: the job moved its whole fleet to this configuration; no epoch of it has ended."""


@dataclass(frozen=True)
class LedgerEntry:
    epoch: int
    flags: dict[str, object]
    fingerprint: str
    concurrency: int | None
    outcome: LedgerOutcome
    tok_s_per_gpu: float | None
    predicted_tok_s_per_gpu: float | None
    reason: str
    at: float


class TuningLedger:
    """Configurations tried in this job, with what they did (tuning.jsonl in the output)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def entries(self) -> list[LedgerEntry]:
        return read_jsonl(self.path, LedgerEntry)

    def record(self, entry: LedgerEntry) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(asdict(entry)) + "\n")

    def tried(self) -> set[str]:
        return {e.fingerprint for e in self.entries()}

    def flags_of(self, entry: LedgerEntry) -> ServerFlags:
        return ServerFlags.model_validate(entry.flags)

    def last_epoch(self) -> int:
        return max((e.epoch for e in self.entries()), default=0)

    def moves(self) -> int:
        """Restarts the job has spent: whole-fleet moves and canary candidates."""
        return sum(e.outcome == "started" or e.reason.startswith("canary ")
                   for e in self.entries())

    def resume_point(self, flags: ServerFlags, concurrency: int | None) -> LedgerEntry | None:
        """The configuration to resume on, when this ledger's job began with `flags` and
        `concurrency` (the same command run again) and later moved elsewhere: the last move,
        unless it then failed or was rolled back, in which case the best measured one. None
        when there is nothing to resume, or the job began with other flags (the user changed
        them: theirs win)."""
        entries = self.entries()
        start = config_key(flags, concurrency)
        if not entries or entries[0].fingerprint != start:
            return None
        moves = [i for i, e in enumerate(entries) if e.outcome == "started"]
        if moves:
            last = entries[moves[-1]]
            undone = any(e.outcome in ("failed", "rolled_back")
                         and e.fingerprint == last.fingerprint
                         for e in entries[moves[-1] + 1:])
            if not undone:
                return last
        best = self.best()
        return best if best is not None and best.fingerprint != start else None

    def best(self, other_than: str | None = None) -> LedgerEntry | None:
        """The fastest measured config (other than `other_than`, a config key: after a
        rollout the running config is in the ledger, and no rollback goes back to itself)."""
        measured = [e for e in self.entries() if e.outcome == "measured" and e.tok_s_per_gpu
                    and config_key(self.flags_of(e), e.concurrency) != other_than]
        return max(measured, key=lambda e: e.tok_s_per_gpu or 0.0) if measured else None


def config_key(flags: ServerFlags, concurrency: int | None) -> str:
    """Ledger identity of a configuration: server flags plus client concurrency."""
    return FleetConfig(flags, concurrency).key


# --- the policy ------------------------------------------------------------------------------


