"""Servers this job runs as its own processes: start, list in the output's registry, stop.

The mechanics under the engines that own processes (tasks/engines/: real SGLang and the
simulator). Servers left by a dead earlier run of this job (found in the registry) are
stopped first — a process is only ever signalled if its pid *and* start time match what we
recorded. SGLang logs its --api-key at startup: the logs are scrubbed after a stop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from infra.files import atomic_write
from infra.processes import (
    ProcessRecord,
    ProcessRegistry,
    ephemeral_port_warning,
    spawn,
    terminate,
    wait_ports_free,
)
from infra.sglang.launch import REDACTED, LaunchSpec
from infra.sglang.secret_config import discard, hide_secrets, secret_file_of
from infra.termination import deliver_pending_stop


class LaunchError(RuntimeError):
    """A server could not be started; the message says why and what to do."""


@dataclass(frozen=True)
class ServerHandle:
    """A running server of this job (serializable: crosses task boundaries)."""

    index: int
    gpu: int
    url: str
    log_path: str
    record: ProcessRecord
    fingerprint: str  # of the server flags it was started with


def registry_for(output: Path) -> ProcessRegistry:
    return ProcessRegistry(output / "servers" / "registry.json")


def stop_stale(registry: ProcessRegistry, grace_s: float) -> list[ProcessRecord]:
    """Stop servers an earlier, dead run of this job left behind (ours only)."""
    stale = registry.load()
    if stale:
        terminate(stale, grace_s)
        registry.clear()
        for record in stale:
            discard(secret_file_of(record.argv))
    return stale


def launch_fleet(specs: list[LaunchSpec], registry: ProcessRegistry,
                 fingerprint: str, grace_s: float = 30.0) -> list[ServerHandle]:
    """Start every server; fail early if a port is held by a process that is not ours."""
    stop_stale(registry, grace_s)
    busy = wait_ports_free(specs[0].host, [s.port for s in specs], timeout_s=5.0) if specs else []
    if busy:
        hint = ephemeral_port_warning(busy)
        raise LaunchError(
            f"base_port: port(s) {', '.join(map(str, busy))} on {specs[0].host} are in use by "
            "another program; pick another base_port" + (f" ({hint})" if hint else ""))
    handles: list[ServerHandle] = []
    try:
        for spec in specs:
            handles.append(launch_one(spec, registry, fingerprint))
    except OSError as exc:
        stop_fleet(handles, registry, grace_s)
        raise LaunchError(f"could not start server: {exc}") from exc
    return handles


def launch_one(spec: LaunchSpec, registry: ProcessRegistry, fingerprint: str) -> ServerHandle:
    """Start one server and list it in the registry (its secrets go through a 0600 file).
    Never after a stop signal: the run ends instead (infra/termination.py)."""
    deliver_pending_stop()
    argv, secret_file = hide_secrets(spec.argv, spec.secrets)
    try:
        _proc, record = spawn(argv, spec.env, spec.log_path, spec.port, spec.host)
    except OSError:
        discard(secret_file)
        raise
    registry.add(record)
    return ServerHandle(spec.index, spec.gpu, spec.url, str(spec.log_path), record, fingerprint)


def stop_one(handle: ServerHandle, registry: ProcessRegistry, grace_s: float,
             secrets: tuple[str, ...] = ()) -> list[int]:
    """Stop one server of a running fleet (the rest keep serving); returns its port if it is
    still busy after the stop."""
    terminate([handle.record], grace_s)
    discard(secret_file_of(handle.record.argv))
    registry.remove(handle.record)
    busy = wait_ports_free(handle.record.host, [handle.record.port], 10.0)
    redact_logs([Path(handle.log_path)], secrets)
    return busy


@dataclass(frozen=True)
class StopReport:
    stopped: int
    killed: list[int]
    ports_busy: list[int]
    gpus_busy: dict[int, int] = field(default_factory=dict)  # GPU index → MiB still used


def stop_fleet(handles: list[ServerHandle], registry: ProcessRegistry,
               grace_s: float, secrets: tuple[str, ...] = ()) -> StopReport:
    """SIGTERM, SIGKILL after the grace period, then verify processes gone and ports free;
    finally scrub secrets from the servers' logs (SGLang logs its --api-key at startup)."""
    records = [h.record for h in handles] or registry.load()
    killed = terminate(records, grace_s)
    for record in records:
        discard(secret_file_of(record.argv))
    busy = [p for p in wait_ports_free(records[0].host, [r.port for r in records], 10.0)
            ] if records else []
    registry.clear()
    redact_logs([Path(r.log_path) for r in records], secrets)
    return StopReport(len(records), killed, busy)


def redact_logs(paths: list[Path], secrets: tuple[str, ...]) -> None:
    """Replace each secret in these (closed) log files with ***."""
    for path in paths:
        if not secrets or not path.is_file():
            continue
        data = path.read_bytes()
        clean = data
        for secret in secrets:
            if secret:
                clean = clean.replace(secret.encode(), REDACTED.encode())
        if clean != data:
            atomic_write(path, clean)
