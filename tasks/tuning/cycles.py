"""The record of every configuration change a run made — fleet restarts, canary cycles,
servers restarted or relaunched alone — as the summary, the report and the `tuning-ledger`
artifact show it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from prefect.artifacts import create_table_artifact


@dataclass
class Cycle:
    """One restart: why, from what to what, and (once the next epoch is up) how long."""

    epoch: int
    measured_tok_s_per_gpu: float | None
    diagnosis: str
    reason: str
    old: str
    new_flags: dict[str, Any]
    new_concurrency: int | None
    predicted_tok_s_per_gpu: float | None = None  # for the new config, by the model
    triggered_at: float | None = None  # time.monotonic() of the trigger; not reported
    cycle_seconds: float | None = None  # trigger → the next fleet healthy
    startup_seconds: float | None = None  # the next fleet's start alone
    kind: str = "fleet"  # "fleet": stop all, relaunch; "canary": k servers first, then rolled
    canary: dict[str, Any] | None = None  # CanaryCycle.record() of a canary cycle

    def record(self) -> dict[str, Any]:
        """As the summary, the report and the tuning-ledger artifact show it."""
        out = asdict(self)
        out.pop("triggered_at")
        return {k: v for k, v in out.items()
                if v is not None or k not in ("cycle_seconds", "startup_seconds", "canary")}

    def next_fleet_up(self, startup_s: float) -> None:
        if self.triggered_at is not None:
            self.cycle_seconds = round(time.monotonic() - self.triggered_at, 2)
            self.startup_seconds = round(startup_s, 2)
            self.triggered_at = None


def cycles_artifact(cycles: list[Cycle]) -> None:
    """The tuning-ledger table in the Prefect UI, rewritten after each cycle."""
    create_table_artifact(key="tuning-ledger", description="configs tried",
                          table=[c.record() for c in cycles])
