"""The engines a fleet runs on, as adapters: real SGLang, the simulated server, and servers
someone else runs (`external`: a Kubernetes deployment, a Slurm job, a router's backends).

Everything that differs between them lives here — which program to start, its environment,
which SGLang version its flags must follow, which GPU profile and clock the tuner reasons in,
what to check before a start and after a stop — so the rest of the pipeline never branches
on `settings.engine`. A third engine (another SGLang build, a remote launcher) is one more
class and one more entry in ENGINES.
"""

from __future__ import annotations

import json
import os
import sys
from abc import ABC, abstractmethod
from pathlib import Path

from infra.settings import JobSettings
from infra.sglang.hardware import Hardware
from infra.sglang.memory import DEFAULT_VERSION
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.versions import SGLangVersion, installed_version, parse_version

CHECKOUT = Path(__file__).resolve().parent.parent


class LaunchError(RuntimeError):
    """A server could not be started; the message says why and what to do."""


class Engine(ABC):
    name = ""
    module = ""  # what `python -m` starts
    checks_gpu_memory_after_stop = False  # nvidia-smi must show the memory freed
    owns_servers = True  # False: the job never starts, stops or restarts a server

    def program(self, settings: JobSettings) -> list[str]:
        """The argv before SGLang's flags: the GPU nodes' Python (`python`), else ours."""
        return [settings.python or sys.executable, "-m", self.module]

    @abstractmethod
    def version(self, settings: JobSettings) -> SGLangVersion:
        """The SGLang release whose flags and memory accounting apply."""

    def env(self, settings: JobSettings, version: SGLangVersion) -> dict[str, str]:
        """Environment beyond CUDA_VISIBLE_DEVICES."""
        return {}

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


class RealSGLang(Engine):
    name = "sglang"
    module = "sglang.launch_server"
    checks_gpu_memory_after_stop = True

    def version(self, settings: JobSettings) -> SGLangVersion:
        if settings.sglang_version:
            return parse_version(settings.sglang_version)
        found = installed_version()
        if found is None:
            raise LaunchError(
                "sglang_version: SGLang is not installed here; install 'expansion[sglang]' or "
                "set sglang_version (and python) to the SGLang that runs on the GPU nodes")
        return found

    def check_before_start(self, settings: JobSettings) -> None:
        """Also: SGLang is importable by the Python that launches it (without this the first
        launch failed 40 s in, after Prefect had started, with a 46-line traceback)."""
        super().check_before_start(settings)
        python = settings.python or sys.executable
        if not module_importable(python, "sglang"):
            raise ValueError(
                f"python: SGLang is not installed for {python}; install 'expansion[sglang]' "
                "there, or set python to the interpreter on the GPU nodes that has it")


def module_importable(python: str, module: str) -> bool:
    """Whether `python` finds `module` (its spec only: importing SGLang takes seconds)."""
    import subprocess

    if python == sys.executable:
        import importlib.util

        return importlib.util.find_spec(module) is not None
    try:
        done = subprocess.run([python, "-c", "import importlib.util, sys; sys.exit("
                               f"importlib.util.find_spec({module!r}) is None)"],
                              capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


class SimulatedSGLang(Engine):
    name = "sim"
    module = "infra.sim"  # takes SGLang's own flags

    def version(self, settings: JobSettings) -> SGLangVersion:
        return parse_version(settings.sglang_version or settings.sim.sglang_version
                             or DEFAULT_VERSION)

    def env(self, settings: JobSettings, version: SGLangVersion) -> dict[str, str]:
        sim = settings.sim
        # The checkout first (the simulator's code), then whatever the caller's PYTHONPATH
        # holds: its dependencies may live there (a device with packages beside Python).
        path = os.pathsep.join(p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH")) if p)
        env = {"EXPANSION_SIM_GPU": sim.gpu, "EXPANSION_SIM_TIME_SCALE": str(sim.time_scale),
               "EXPANSION_SIM_SGLANG_VERSION": version.label, "PYTHONPATH": path}
        if settings.weights_gib is not None:
            env["EXPANSION_SIM_WEIGHTS_GIB"] = str(settings.weights_gib)
        if sim.startup_s is not None:
            env["EXPANSION_SIM_STARTUP_S"] = str(sim.startup_s)
        if sim.faults:
            env["EXPANSION_SIM_FAULTS"] = json.dumps(sim.faults)
        if sim.output_mean_tokens is not None:
            env["EXPANSION_SIM_OUTPUT_LENGTHS"] = (f"{sim.output_mean_tokens},"
                                                   f"{sim.output_p99_tokens}")
        return env

    def gpu_name(self, settings: JobSettings) -> str:
        return settings.sim.gpu

    def time_scale(self, settings: JobSettings) -> float:
        return settings.sim.time_scale

    def check_before_start(self, settings: JobSettings) -> None:
        # The simulator needs profiles to size its pools; real SGLang reads the model itself.
        model_profile(settings.model, settings.weights_gib)
        super().check_before_start(settings)
        gpu_profile(settings.sim.gpu)


class ExternalServers(Engine):
    """Servers started by someone else, at `server_urls`. The job measures each one's
    capacity, monitors and diagnoses them, and writes exactly-once output as usual; it never
    stops or restarts them, so the tuner advises (the flags to relaunch with and the gain
    predicted, in the summary and a `tuning-advice` artifact) instead of acting. The flags
    the advice starts from are the job's `[server]` section: say there what they run with."""

    name = "external"
    owns_servers = False

    def program(self, settings: JobSettings) -> list[str]:
        raise LaunchError("engine=external: this job starts no server")

    def version(self, settings: JobSettings) -> SGLangVersion:
        return parse_version(settings.sglang_version or DEFAULT_VERSION)

    def check_before_start(self, settings: JobSettings) -> None:
        """Every server answers /health before anything starts (a typo in a URL was found
        only when the dispatcher gave up on it)."""
        import httpx

        headers = ({"Authorization": f"Bearer {settings.api_key.get_secret_value()}"}
                   if settings.api_key else {})
        for url in settings.server_urls:
            try:
                status = httpx.get(f"{url}/health", timeout=5.0, headers=headers).status_code
            except httpx.HTTPError as exc:
                raise ValueError(f"server_urls: {url} does not answer ({type(exc).__name__}); "
                                 "start it or fix the URL") from None
            if status != 200:
                raise ValueError(f"server_urls: {url}/health answered {status}; wait until it "
                                 "is up (or give api_key if it needs one)")


# Hybrids whose first layer is a state layer: 0.5.17's triton attention backend cannot start
# them (it refuses NemotronH and LFM2; Granite-4.0-H died with "layer_id=0 not in full attention
# layers" on the H200, docs/REAL_SGLANG.md session 9).
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


ENGINES: dict[str, Engine] = {e.name: e for e in (RealSGLang(), SimulatedSGLang(),
                                                  ExternalServers())}


def engine_for(settings: JobSettings) -> Engine:
    return ENGINES[settings.engine]
