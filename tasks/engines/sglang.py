"""Real SGLang: `python -m sglang.launch_server` on the GPU nodes' Python, one per GPU."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from infra.gpu import wait_memory_released
from infra.sglang.versions import SGLangVersion, installed_version, parse_version
from tasks.engines.base import LocalServers
from tasks.engines.sglang_family import SGLangFamily
from tasks.local_servers import LaunchError, ServerHandle, StopReport


class RealSGLang(SGLangFamily, LocalServers):
    name = "sglang"
    module = "sglang.launch_server"
    checks_gpu_memory_after_stop = True

    def version(self) -> SGLangVersion:
        if self.settings.sglang_version:
            return parse_version(self.settings.sglang_version)
        found = installed_version()
        if found is None:
            raise LaunchError(
                "sglang_version: SGLang is not installed here; install 'expansion[sglang]' or "
                "set sglang_version (and python) to the SGLang that runs on the GPU nodes")
        return found

    def check_before_start(self) -> None:
        """Also: SGLang is importable by the Python that launches it (a launch without it
        fails 40 s in, after Prefect has started, with a 46-line traceback)."""
        super().check_before_start()
        python = self.settings.python or sys.executable
        if not module_importable(python, "sglang"):
            raise ValueError(
                f"python: SGLang is not installed for {python}; install 'expansion[sglang]' "
                "there, or set python to the interpreter on the GPU nodes that has it")

    def stop(self, handles: list[ServerHandle], output: Path) -> StopReport | None:
        """Also wait for nvidia-smi to show the memory freed: a next launch on a GPU still
        holding the last one's memory gets smaller pools."""
        report = super().stop(handles, output)
        gpus = sorted({h.gpu for h in handles})  # several servers may share one GPU
        return replace(report, gpus_busy=wait_memory_released(gpus)) if report else None


def module_importable(python: str, module: str) -> bool:
    """Whether `python` finds `module` (its spec only: importing SGLang takes seconds)."""
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
