"""What the SGLang engines share (real SGLang, the simulator, SGLang servers someone else
runs): SGLang's release, its CLI (`infra/sglang/launch.py`), its HTTP API and metrics, and
the planner that models its pools — so the tuner can reason about them."""

from __future__ import annotations

from abc import abstractmethod

from infra.settings import JobSettings
from infra.sglang.flags import ServerFlags
from infra.sglang.hardware import Hardware
from infra.sglang.launch import config_args, server_args
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.versions import SGLangVersion, parse_version
from tasks.capacity import Capacity, measure_one
from tasks.engines.base import Engine
from tasks.local_servers import ServerHandle
from tasks.monitor import SGLangMetrics
from tasks.requests import SGLangRequests


class SGLangFamily(Engine):
    requests = SGLangRequests()
    metrics = SGLangMetrics()

    @abstractmethod
    def version(self) -> SGLangVersion:
        """The SGLang release whose flags and memory accounting apply."""

    def gpu_name(self) -> str:
        """The GPU profile the memory model and the roofline use."""
        return self.settings.gpu_type

    def hardware(self, server_version: str | None) -> Hardware | None:
        """The configured version, else the one the servers report; None where the model,
        GPU or version is unknown."""
        version = self.settings.sglang_version or server_version
        if not version:
            return None
        try:
            return Hardware(model_profile(self.settings.model, self.settings.weights_gib),
                            gpu_profile(self.gpu_name()), parse_version(version))
        except ValueError:
            return None

    def check_before_start(self) -> None:
        super().check_before_start()
        check_attention_backend(self.settings)

    def _hybrid(self) -> bool:
        return model_is_hybrid(self.settings.model, self.settings.weights_gib)

    def server_flags(self, flags: ServerFlags) -> list[str]:
        return config_args(flags, self.version(), hybrid=self._hybrid())

    def server_argv(self, flags: ServerFlags, port: int) -> list[str]:
        return server_args(flags, self.version(), model=self.settings.model,
                           host=self.settings.host, port=port, api_key=self.api_key,
                           hybrid=self._hybrid())

    def capacity(self, handle: ServerHandle) -> Capacity:
        """Pools and caps from the server's own /server_info."""
        return measure_one(handle, self.api_key)


def model_is_hybrid(model: str, weights_gib: float | None) -> bool:
    """Whether the model has mamba layers; a model without a profile counts as hybrid (SGLang
    decides its flags; we only lose planning)."""
    try:
        return model_profile(model, weights_gib).hybrid
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
