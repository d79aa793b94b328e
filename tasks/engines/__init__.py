"""The engines a fleet runs on (real SGLang, the simulator, servers someone else runs), by
the name `settings.engine` gives. A new engine: one module here and one entry below."""

from __future__ import annotations

from infra.settings import JobSettings
from tasks.engines.base import Engine, LocalServers, model_is_hybrid
from tasks.engines.external import ExternalServers
from tasks.engines.sglang import RealSGLang
from tasks.engines.sim import SimulatedSGLang

ENGINES: dict[str, Engine] = {e.name: e for e in (RealSGLang(), SimulatedSGLang(),
                                                  ExternalServers())}

__all__ = ["ENGINES", "Engine", "LocalServers", "engine_for", "model_is_hybrid"]


def engine_for(settings: JobSettings) -> Engine:
    return ENGINES[settings.engine]
