"""What every engine is: the one owner of its servers — how they start (argv, environment),
how the job waits for them, measures their capacity, reads their metrics, sends them rows and
reads their answers, and how they stop — so the rest of the pipeline never branches on
`settings.engine`.

An engine is built once per run (`build_engine` in tasks/engines/__init__.py) from the job's
fixed facts — model, GPUs, ports, secrets — and owns them; what changes between epochs, the
server flags, comes with each launch. Nothing here knows a server's CLI or API: the SGLang
engines share theirs in tasks/engines/sglang_family.py, vLLM has its own.

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
from infra.sglang.launch import LaunchSpec
from tasks.capacity import Capacity
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
from tasks.monitor import MetricsReader
from tasks.requests import RequestShapes


class Engine(ABC):
    name = ""
    owns_servers = True  # False: the job never starts, stops or restarts a server
    checks_gpu_memory_after_stop = False  # nvidia-smi must show the memory freed
    requests: RequestShapes  # a row as a request, an answer as columns
    metrics: MetricsReader  # what the monitor reads from /metrics

    def __init__(self, settings: JobSettings) -> None:
        self.settings = settings  # the job's facts; `settings.server` is only the first flags

    @property
    def api_key(self) -> str | None:
        key = self.settings.api_key
        return key.get_secret_value() if key else None

    # --- what it runs on ----------------------------------------------------------------

    def time_scale(self) -> float:
        """Modeled GPU seconds per wall second (1 on a real GPU)."""
        return 1.0

    def hardware(self, server_version: str | None) -> Hardware | None:
        """The model, GPU and release the tuner's planner reasons about; None where the
        planner has no model of this engine (the tuner then measures but never moves)."""
        return None

    def check_before_start(self) -> None:
        """Raise ValueError naming the field when this engine cannot run the job."""
        return None  # (nothing every engine checks; each engine adds its own)

    @abstractmethod
    def server_flags(self, flags: ServerFlags) -> list[str]:
        """The server's own flags for `flags`, as pasted after its model, host and port
        (the tuner's advice for servers someone else relaunches)."""

    # --- its servers --------------------------------------------------------------------

    @abstractmethod
    def launch_specs(self, flags: ServerFlags, output: Path,
                     epoch: int = 1) -> list[LaunchSpec]:
        """One LaunchSpec per server this job starts (none for servers it does not own)."""

    @abstractmethod
    def start(self, flags: ServerFlags, output: Path, epoch: int) -> list[ServerHandle]:
        """The fleet of one epoch: started, or (servers someone else runs) found."""

    @abstractmethod
    def stop(self, handles: list[ServerHandle], output: Path) -> StopReport | None:
        """Stop the fleet; None where the job does not own it (nothing stopped)."""

    def wait_healthy(self, handles: list[ServerHandle],
                     abort: threading.Event | None = None) -> float:
        """Block until every server answers /health; the seconds it took."""
        return wait_until_healthy(handles, self.api_key, self.settings.startup_timeout_s,
                                  abort=abort)

    @abstractmethod
    def capacity(self, handle: ServerHandle) -> Capacity:
        """What the server got (pools and caps), from the server itself."""


class LocalServers(Engine):
    """Engines whose servers are this job's own processes, one per GPU (or several sharing
    one), started with `program()` + `server_argv()`, listed in the output's registry."""

    module = ""  # what `python -m` starts

    def program(self) -> list[str]:
        """The argv before the server's flags: the GPU nodes' Python (`python`), else ours."""
        return [self.settings.python or sys.executable, "-m", self.module]

    @abstractmethod
    def server_argv(self, flags: ServerFlags, port: int) -> list[str]:
        """The server's whole command line after `program()`, for one port."""

    def env(self) -> dict[str, str]:
        """Environment beyond CUDA_VISIBLE_DEVICES."""
        return {}

    def launch_specs(self, flags: ServerFlags, output: Path,
                     epoch: int = 1) -> list[LaunchSpec]:
        """Argv, env (CUDA_VISIBLE_DEVICES, the engine's), port and log file per server; each
        fleet configuration (epoch) of a job logs to its own files."""
        job = self.settings
        placement = [gpu for gpu in job.gpus for _ in range(job.servers_per_gpu)]
        env = self.env()
        specs = []
        for index, gpu in enumerate(placement):
            port = job.base_port + index
            log = (f"server-{index}-gpu{gpu}.log" if epoch == 1
                   else f"server-{index}-gpu{gpu}.epoch{epoch}.log")
            specs.append(LaunchSpec(
                index=index, gpu=gpu, host=job.host, port=port,
                argv=tuple(self.program() + self.server_argv(flags, port)),
                env={"CUDA_VISIBLE_DEVICES": str(gpu), **env},
                log_path=output / "servers" / log, secrets=self._secrets()))
        return specs

    def start(self, flags: ServerFlags, output: Path, epoch: int) -> list[ServerHandle]:
        return launch_fleet(self.launch_specs(flags, output, epoch), registry_for(output),
                            flags.fingerprint(), self.settings.stop_grace_s)

    def start_one(self, spec: LaunchSpec, flags: ServerFlags, output: Path) -> ServerHandle:
        """One server of a running fleet, on `spec`'s GPU and port (a rolling restart)."""
        return launch_one(spec, registry_for(output), flags.fingerprint())

    def stop_one(self, handle: ServerHandle, output: Path) -> list[int]:
        """Stop one server (the rest keep serving); its port if still busy after."""
        return stop_one(handle, registry_for(output), self.settings.stop_grace_s,
                        self._secrets())

    def stop(self, handles: list[ServerHandle], output: Path) -> StopReport | None:
        return stop_fleet(handles, registry_for(output), self.settings.stop_grace_s,
                          self._secrets())

    def _secrets(self) -> tuple[str, ...]:
        return (self.api_key,) if self.api_key else ()
