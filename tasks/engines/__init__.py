"""The engines a fleet runs on (real SGLang, the simulator, SGLang servers someone else runs,
vLLM), by the name `settings.engine` gives. A new engine: one module here and one entry below;
a run builds its engine once (`build_engine`) and hands it to whatever starts, stops, measures
or talks to its servers."""

from __future__ import annotations

from infra.settings import JobSettings
from tasks.engines.base import Engine, LocalServers
from tasks.engines.external import ExternalServers
from tasks.engines.sglang import RealSGLang
from tasks.engines.sglang_family import SGLangFamily, model_is_hybrid
from tasks.engines.sim import SimulatedSGLang
from tasks.engines.vllm import VLLMServers

ENGINES: dict[str, type[Engine]] = {e.name: e for e in (RealSGLang, SimulatedSGLang,
                                                        ExternalServers, VLLMServers)}

__all__ = ["ENGINES", "Engine", "LocalServers", "SGLangFamily", "build_engine",
           "model_is_hybrid"]


def build_engine(settings: JobSettings) -> Engine:
    """The job's engine, owning the job's facts (its flags come with each launch)."""
    return ENGINES[settings.engine](settings)
