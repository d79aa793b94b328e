"""Launch and stop the fleet: one server per GPU, distinct ports, a log file each.

Same code for `engine=sim` and `engine=sglang`; what differs is in tasks/engines.py. Servers
left by a dead earlier run of this job (found in the output's registry) are stopped first —
a process is only ever signalled if its pid *and* start time match what we recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import SecretStr

from infra.files import atomic_write
from infra.gpu import wait_memory_released
from infra.processes import (
    ProcessRecord,
    ProcessRegistry,
    ephemeral_port_warning,
    spawn,
    terminate,
    wait_ports_free,
)
from infra.settings import JobSettings
from infra.sglang.launch import REDACTED, LaunchSpec, server_args
from infra.sglang.profiles import model_profile
from infra.sglang.secret_config import discard, hide_secrets, secret_file_of
from infra.sglang.versions import SGLangVersion
from tasks.engines import LaunchError, engine_for


@dataclass(frozen=True)
class ServerHandle:
    """A running server of this job (serializable: crosses task boundaries)."""

    index: int
    gpu: int
    url: str
    log_path: str
    record: ProcessRecord
    config: str  # server-flags fingerprint


def registry_for(output: Path) -> ProcessRegistry:
    return ProcessRegistry(output / "servers" / "registry.json")


def resolve_version(settings: JobSettings) -> SGLangVersion:
    """The SGLang release the launch flags follow (configured, installed, or the sim's)."""
    return engine_for(settings).version(settings)


def model_is_hybrid(settings: JobSettings) -> bool:
    """Whether the model has mamba layers; a model without a profile counts as hybrid (SGLang
    decides its flags; we only lose planning)."""
    try:
        return model_profile(settings.model, settings.weights_gib).hybrid
    except ValueError:
        return True


def build_launch_specs(settings: JobSettings, output: Path, epoch: int = 1) -> list[LaunchSpec]:
    """One LaunchSpec per GPU: argv, env (CUDA_VISIBLE_DEVICES, sim knobs), port, log file.

    Each fleet configuration (epoch) of a job logs to its own files. None for servers the
    job does not start (engine=external)."""
    engine = engine_for(settings)
    if not engine.owns_servers:
        return []
    version = engine.version(settings)
    hybrid = model_is_hybrid(settings)
    api_key = settings.api_key.get_secret_value() if settings.api_key else None
    specs = []
    placement = [(gpu, k) for gpu in settings.gpus for k in range(settings.servers_per_gpu)]
    for index, (gpu, _) in enumerate(placement):
        port = settings.base_port + index
        argv = engine.program(settings) + server_args(
            settings.server, version, model=settings.model, host=settings.host, port=port,
            api_key=api_key, hybrid=hybrid)
        env = {"CUDA_VISIBLE_DEVICES": str(gpu), **engine.env(settings, version)}
        specs.append(LaunchSpec(
            index=index, gpu=gpu, host=settings.host, port=port, argv=tuple(argv), env=env,
            log_path=output / "servers" / (f"server-{index}-gpu{gpu}.log" if epoch == 1
                                            else f"server-{index}-gpu{gpu}.epoch{epoch}.log"),
            secrets=(api_key,) if api_key else ()))
    return specs


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
                 config: str, grace_s: float = 30.0) -> list[ServerHandle]:
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
            handles.append(launch_one(spec, registry, config))
    except OSError as exc:
        stop_fleet(handles, registry, grace_s)
        raise LaunchError(f"could not start server: {exc}") from exc
    return handles


def launch_one(spec: LaunchSpec, registry: ProcessRegistry, config: str) -> ServerHandle:
    """Start one server and list it in the registry (its secrets go through a 0600 file)."""
    argv, secret_file = hide_secrets(spec.argv, spec.secrets)
    try:
        _proc, record = spawn(argv, spec.env, spec.log_path, spec.port, spec.host)
    except OSError:
        discard(secret_file)
        raise
    registry.add(record)
    return ServerHandle(spec.index, spec.gpu, spec.url, str(spec.log_path), record, config)


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


@task(name="launch_servers", cache_policy=NO_CACHE, retries=0)
def launch_servers(settings: JobSettings, output: str, epoch: int = 1) -> list[ServerHandle]:
    if not engine_for(settings).owns_servers:
        return external_handles(settings)
    out = Path(output)
    specs = build_launch_specs(settings, out, epoch)
    return launch_fleet(specs, registry_for(out), settings.server.fingerprint(),
                        settings.stop_grace_s)


def external_handles(settings: JobSettings) -> list[ServerHandle]:
    """Handles on servers someone else runs: no process of ours (pid 0), no log of ours;
    nothing in this job stops them (stop_servers is not called for them)."""
    from urllib.parse import urlsplit

    handles = []
    for index, url in enumerate(settings.server_urls):
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        record = ProcessRecord(0, 0, port, parts.hostname or "", "", [])
        handles.append(ServerHandle(index, -1, url, "", record, settings.server.fingerprint()))
    return handles


@task(name="stop_servers", cache_policy=NO_CACHE, retries=0)
def stop_servers(handles: list[ServerHandle], output: str, grace_s: float,
                 api_key: SecretStr | None = None, check_gpu_memory: bool = False,
                 ) -> StopReport:
    """Stop the fleet; with real SGLang also wait for nvidia-smi to show the memory freed."""
    secrets = (api_key.get_secret_value(),) if api_key else ()
    report = stop_fleet(handles, registry_for(Path(output)), grace_s, secrets)
    if check_gpu_memory:
        gpus = sorted({h.gpu for h in handles})  # several servers may share one GPU
        report = replace(report, gpus_busy=wait_memory_released(gpus))
    return report
