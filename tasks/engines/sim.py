"""The simulated SGLang server (infra/sim): a real HTTP server process per GPU slot that
takes SGLang's own flags and answers as 0.5.17 does, in modeled GPU time."""

from __future__ import annotations

import json
import os
from pathlib import Path

from infra.sglang.memory import DEFAULT_VERSION
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.versions import SGLangVersion, parse_version
from tasks.engines.base import LocalServers
from tasks.engines.sglang_family import SGLangFamily

CHECKOUT = Path(__file__).resolve().parents[2]


class SimulatedSGLang(SGLangFamily, LocalServers):
    name = "sim"
    module = "infra.sim"  # takes SGLang's own flags

    def version(self) -> SGLangVersion:
        settings = self.settings
        return parse_version(settings.sglang_version or settings.sim.sglang_version
                             or DEFAULT_VERSION)

    def env(self) -> dict[str, str]:
        settings, version = self.settings, self.version()
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

    def gpu_name(self) -> str:
        return self.settings.sim.gpu

    def time_scale(self) -> float:
        return self.settings.sim.time_scale

    def check_before_start(self) -> None:
        # The simulator needs profiles to size its pools; real SGLang reads the model itself.
        model_profile(self.settings.model, self.settings.weights_gib)
        super().check_before_start()
        gpu_profile(self.settings.sim.gpu)
