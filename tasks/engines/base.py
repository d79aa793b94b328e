"""What every engine is: the one owner of its servers — how they start (argv, environment),
how the job waits for them, measures their capacity, reads their metrics, sends them rows and
reads their answers, and how they stop — so the rest of the pipeline never branches on
`settings.engine`. Every engine today speaks SGLang's HTTP API (the defaults below); one
that does not overrides `requests`, `metrics`, `wait_healthy` and `capacity`.

A new engine is one file beside this one and one line in tasks/engines/__init__.py.
"""

from __future__ import annotations

import sys
import threading
from abc import ABC, abstractmethod
from pathlib import Path

from infra.settings import JobSettings
from infra.sglang.flags import ServerFlags
from infra.sglang.hardware import Hardware
from infra.sglang.launch import LaunchSpec, server_args
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.versions import SGLangVersion, parse_version
from tasks.capacity import Capacity, measure_one
from tasks.health import wait_until_healthy
from tasks.local_servers import (
    ServerHandle,
    StopReport,
    launch_fleet,
    launch_one,
    registry_for,
    stop_fleet,
    stop_one,
)
from tasks.monitor import SGLangMetrics
from tasks.requests import SGLangRequests


class Engine(ABC):
    name = ""
    owns_servers = True  # False: the job never starts, stops or restarts a server
    checks_gpu_memory_after_stop = False  # nvidia-smi must show the memory freed
    requests = SGLangRequests()  # a row as a request, an answer as columns
    metrics = SGLangMetrics()  # what the monitor reads from /metrics, by SGLang's names

    # --- what it runs on ----------------------------------------------------------------

    @abstractmethod
    def version(self, settings: JobSettings) -> SGLangVersion:
        """The SGLang release whose flags and memory accounting apply."""

    def gpu_name(self, settings: JobSettings) -> str:
        """The GPU profile the memory model and the roofline use."""
        return settings.gpu_type

    def time_scale(self, settings: JobSettings) -> float:
        """Modeled GPU seconds per wall second (1 on a real GPU)."""
        return 1.0

    def hardware(self, settings: JobSettings, server_version: str | None) -> Hardware | None:
        """The model, GPU and SGLang release the tuner reasons about (the configured
        version, else the one the servers report); None where one of them is unknown."""
        version = settings.sglang_version or server_version
        if not version:
            return None
        try:
            return Hardware(model_profile(settings.model, settings.weights_gib),
                            gpu_profile(self.gpu_name(settings)), parse_version(version))
        except ValueError:
            return None

    def check_before_start(self, settings: JobSettings) -> None:
        """Raise ValueError naming the field when this engine cannot run these settings."""
        check_attention_backend(settings)

    def server_flags(self, settings: JobSettings, flags: ServerFlags) -> list[str]:
        """SGLang's flags for `flags`, as pasted after `--model-path M --host H --port P`
        (the tuner's advice for servers someone else relaunches)."""
        argv = server_args(flags, self.version(settings), model=settings.model, host="-",
                           port=0, api_key=None, hybrid=model_is_hybrid(settings))
        return argv[6:]  # after --model-path, --host and --port

    # --- its servers --------------------------------------------------------------------

    @abstractmethod
    def launch_specs(self, settings: JobSettings, output: Path,
                     epoch: int = 1) -> list[LaunchSpec]:
        """One LaunchSpec per server this job starts (none for servers it does not own)."""

    @abstractmethod
    def start(self, settings: JobSettings, output: Path, epoch: int) -> list[ServerHandle]:
        """The fleet of one epoch: started, or (servers someone else runs) found."""

    @abstractmethod
    def stop(self, handles: list[ServerHandle], output: Path,
             settings: JobSettings) -> StopReport | None:
        """Stop the fleet; None where the job does not own it (nothing stopped)."""

    def wait_healthy(self, handles: list[ServerHandle], settings: JobSettings,
                     abort: threading.Event | None = None) -> float:
        """Block until every server answers /health; the seconds it took."""
        key = settings.api_key.get_secret_value() if settings.api_key else None
        return wait_until_healthy(handles, key, settings.startup_timeout_s, abort=abort)

    def capacity(self, handle: ServerHandle, api_key: str | None) -> Capacity:
        """What the server got (pools and caps), from its own /server_info."""
        return measure_one(handle, api_key)


class LocalServers(Engine):
    """Engines whose servers are this job's own processes, one per GPU (or several sharing
    one), started with `program()` + SGLang's flags, listed in the output's registry."""

    module = ""  # what `python -m` starts

    def program(self, settings: JobSettings) -> list[str]:
        """The argv before SGLang's flags: the GPU nodes' Python (`python`), else ours."""
        return [settings.python or sys.executable, "-m", self.module]

    def env(self, settings: JobSettings, version: SGLangVersion) -> dict[str, str]:
        """Environment beyond CUDA_VISIBLE_DEVICES."""
        return {}

    def launch_specs(self, settings: JobSettings, output: Path,
                     epoch: int = 1) -> list[LaunchSpec]:
        """Argv, env (CUDA_VISIBLE_DEVICES, the engine's), port and log file per server; each
        fleet configuration (epoch) of a job logs to its own files."""
        version = self.version(settings)
        hybrid = model_is_hybrid(settings)
        api_key = settings.api_key.get_secret_value() if settings.api_key else None
        placement = [gpu for gpu in settings.gpus for _ in range(settings.servers_per_gpu)]
        specs = []
        for index, gpu in enumerate(placement):
            port = settings.base_port + index
            argv = self.program(settings) + server_args(
                settings.server, version, model=settings.model, host=settings.host,
                port=port, api_key=api_key, hybrid=hybrid)
            log = (f"server-{index}-gpu{gpu}.log" if epoch == 1
                   else f"server-{index}-gpu{gpu}.epoch{epoch}.log")
            specs.append(LaunchSpec(
                index=index, gpu=gpu, host=settings.host, port=port, argv=tuple(argv),
                env={"CUDA_VISIBLE_DEVICES": str(gpu), **self.env(settings, version)},
                log_path=output / "servers" / log, secrets=(api_key,) if api_key else ()))
        return specs

    def start(self, settings: JobSettings, output: Path, epoch: int) -> list[ServerHandle]:
        return launch_fleet(self.launch_specs(settings, output, epoch), registry_for(output),
                            settings.server.fingerprint(), settings.stop_grace_s)

    def start_one(self, spec: LaunchSpec, settings: JobSettings,
                  output: Path) -> ServerHandle:
        """One server of a running fleet, on `spec`'s GPU and port (a rolling restart)."""
        return launch_one(spec, registry_for(output), settings.server.fingerprint())

    def stop_one(self, handle: ServerHandle, settings: JobSettings, output: Path) -> list[int]:
        """Stop one server (the rest keep serving); its port if still busy after."""
        return stop_one(handle, registry_for(output), settings.stop_grace_s, _secrets(settings))

    def stop(self, handles: list[ServerHandle], output: Path,
             settings: JobSettings) -> StopReport | None:
        return stop_fleet(handles, registry_for(output), settings.stop_grace_s,
                          _secrets(settings))


def _secrets(settings: JobSettings) -> tuple[str, ...]:
    return (settings.api_key.get_secret_value(),) if settings.api_key else ()


def model_is_hybrid(settings: JobSettings) -> bool:
    """Whether the model has mamba layers; a model without a profile counts as hybrid (SGLang
    decides its flags; we only lose planning)."""
    try:
        return model_profile(settings.model, settings.weights_gib).hybrid
    except ValueError:
        return True


# Hybrids whose first layer is a state layer: 0.5.17's triton attention backend cannot start
# them (it refuses NemotronH and LFM2; Granite-4.0-H died with "layer_id=0 not in full attention
# layers" on the H200: docs/REAL_SGLANG.md, "four more families").
NO_TRITON_ATTENTION = ("NemotronH", "Lfm2", "GraniteMoeHybrid")


def check_attention_backend(settings: JobSettings) -> None:
    """Refuse `--attention-backend triton` for those, before any server starts."""
    args = list(settings.server.extra_args)
    if "--attention-backend" not in args or args[args.index("--attention-backend") + 1:][:1] != [
            "triton"]:
        return
    try:
        arch = model_profile(settings.model, settings.weights_gib or 1.0).architecture
    except ValueError:
        return  # a model the planner has no profile of: SGLang itself will say
    if arch.startswith(NO_TRITON_ATTENTION):
        raise ValueError(
            f"server.extra_args: --attention-backend triton cannot run {arch} (its first layer "
            "is a state layer: SGLang 0.5.17 refuses or fails to start it); use flashinfer")
