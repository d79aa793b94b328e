"""A fleet that cannot serve, told from rows that kill servers.

A row that kills a server kills the one that runs it; the others keep answering, and the
suspects' lane (suspects.py) finds the row. A broken build, a bad driver or an unsupported
kernel backend kills *every* server on its first batch, whatever rows it holds — real SGLang
0.5.17 on the H200 did (a device-side assert, then `CUBLAS_STATUS_EXECUTION_FAILED`:
tests/fixtures/sglang-samples/crash-first-batch-0.5.17.log). Blaming rows then quarantines
innocent ones and relaunches forever. So while the fleet has answered nothing, a death
quarantines no row (its rows stay suspects); once every server has died on its first batch
and `relaunches` more deaths of relaunched servers followed (1; 0 when the output folder
records that these same flags failed so before), the run stops with FleetCannotServe: bounded
by the servers' start-up and first batch, twice (35 s for 2 simulated servers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tasks.run_ends import RunEnd

RECORD = "servers/cannot-serve.json"  # in the output folder: flags that could not serve


class FleetCannotServe(RunEnd):
    """Every server died on its first batch, again after a relaunch."""

    kind = "cannot_serve"

    def __init__(self, message: str, deaths: dict[str, int]) -> None:
        super().__init__(message)
        self.deaths = deaths


@dataclass
class FirstBatchWatch:
    """Answers per server since its (re)start, and deaths of servers that had answered none."""

    servers: list[str]
    relaunches: int = 1
    answered: dict[str, int] = field(default_factory=dict)
    deaths: dict[str, int] = field(default_factory=dict)
    _seen: set[tuple[str, int]] = field(default_factory=set)
    total_answers: int = 0

    def answer(self, server: str) -> None:
        self.answered[server] = self.answered.get(server, 0) + 1
        self.total_answers += 1

    def joined(self, server: str) -> None:
        self.answered[server] = 0
        if server not in self.servers:
            self.servers.append(server)

    def blames_rows(self, server: str) -> bool:
        """Whether a death of this server may quarantine the rows it ran: not while the
        fleet has answered nothing (the fault is the fleet's until a server answers; the
        rows stay implicated, so the suspects' lane still finds a killer once one does)."""
        return self.total_answers > 0 or self.answered.get(server, 0) > 0

    def died(self, server: str, generation: int) -> FleetCannotServe | None:
        """Count a first-batch death (once per server generation); the verdict, if reached."""
        if self.blames_rows(server) or (server, generation) in self._seen:
            return None
        self._seen.add((server, generation))
        self.deaths[server] = self.deaths.get(server, 0) + 1
        if sum(self.deaths.values()) >= len(self.servers) + self.relaunches:
            return self.all_dead()
        return None

    def all_dead(self) -> FleetCannotServe | None:
        """The verdict when every server is gone: cannot serve if each died on its first
        batch with nothing answered (a relaunch that had not come up yet changes nothing)."""
        if self.total_answers or not all(self.deaths.get(s, 0) for s in self.servers):
            return None
        told = ", ".join(f"{s} {n}×" for s, n in sorted(self.deaths.items()))
        again = ", again after a relaunch" if sum(self.deaths.values()) > len(self.servers) else ""
        return FleetCannotServe(f"every server died on its first batch{again} ({told}) before "
                                "any answered; no row is blamed", dict(self.deaths))


def recorded_failure(output: Path, fingerprint: str) -> bool:
    """Whether an earlier run on this folder found these flags unable to serve."""
    try:
        return json.loads((output / RECORD).read_text()).get("flags") == fingerprint
    except (OSError, ValueError):
        return False


def record_failure(output: Path, fingerprint: str, deaths: dict[str, int]) -> None:
    path = output / RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"flags": fingerprint, "deaths": deaths}) + "\n")


def forget_failure(output: Path) -> None:
    (output / RECORD).unlink(missing_ok=True)
