"""What the tuner changes about a fleet, as one value: the servers' launch flags and the
client's concurrency per server.

The policy proposes one, the ledger keys its lines by one, the canary and the rolling restart
take one, and the engine launches its flags. The job's fixed facts (model, GPUs, ports,
tuning limits, sampling) stay in `JobSettings`, whose `server` and `client` fields are only
where a job starts: once the tuner moves, the running `FleetConfig` is the truth.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.settings import JobSettings
from infra.sglang.flags import ServerFlags


@dataclass(frozen=True, eq=False)
class FleetConfig:
    """Immutable; equal and hashed by `key`, the ledger's identity of a configuration."""

    flags: ServerFlags
    concurrency: int | None  # client requests in flight per server (None: the server's cap)

    @classmethod
    def of(cls, settings: JobSettings) -> FleetConfig:
        """The configuration a job's settings start it on."""
        return cls(settings.server, settings.client.concurrency_per_server)

    @property
    def key(self) -> str:
        """Server flags plus client concurrency: one line of the ledger per value."""
        return f"{self.flags.fingerprint()}|{self.concurrency}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FleetConfig) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def applied_to(self, job: JobSettings) -> JobSettings:
        """The job's settings running this configuration: what an epoch's launch and shard
        tasks are handed (they read the flags and the concurrency with the job's facts)."""
        return job.model_copy(update={
            "server": self.flags,
            "client": job.client.model_copy(update={"concurrency_per_server": self.concurrency})})
