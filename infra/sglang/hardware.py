"""A model on a GPU under one SGLang release: the one record the memory model, the step-time
model and the tuner's policy reason about (before it, model, GPU and version travelled as
three loose parameters through a dozen signatures)."""

from __future__ import annotations

from dataclasses import dataclass

from infra.sglang.flags import ServerFlags
from infra.sglang.memory import MemoryPlan, PoolsDoNotFit, plan_memory
from infra.sglang.profiles import GpuProfile, ModelProfile
from infra.sglang.versions import SGLangVersion


@dataclass(frozen=True)
class Hardware:
    model: ModelProfile
    gpu: GpuProfile
    version: SGLangVersion

    def memory_plan(self, flags: ServerFlags) -> MemoryPlan:
        """SGLang's pools for these flags; raises PoolsDoNotFit as SGLang would refuse."""
        return plan_memory(self.model, self.gpu, flags, self.version)

    def memory_plan_or_none(self, flags: ServerFlags) -> MemoryPlan | None:
        """The pools, or None where SGLang would not start with these flags."""
        try:
            return self.memory_plan(flags)
        except PoolsDoNotFit:
            return None
