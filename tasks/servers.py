"""The fleet of one epoch as Prefect tasks — start it, wait until it answers, measure what
each server got, stop it — each carried out by the fleet's engine (tasks/engines/), so a
run's timeline shows when servers came and went."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from infra.settings import JobSettings
from tasks.capacity import Capacity
from tasks.engines import engine_for
from tasks.local_servers import ServerHandle, StopReport


@task(name="launch_servers", cache_policy=NO_CACHE, retries=0)
def launch_servers(settings: JobSettings, output: str, epoch: int = 1) -> list[ServerHandle]:
    return engine_for(settings).start(settings, Path(output), epoch)


@task(name="wait_healthy", cache_policy=NO_CACHE)
def wait_healthy(handles: list[ServerHandle], settings: JobSettings) -> float:
    """Seconds until every server answered; raises ServerStartFailed (tasks/health.py)."""
    return engine_for(settings).wait_healthy(handles, settings)


@task(name="measure_capacity", cache_policy=NO_CACHE, retries=3,
      retry_delay_seconds=[1, 2, 4])
def measure_capacity(handles: list[ServerHandle], settings: JobSettings) -> list[Capacity]:
    """Every server's own figures: a GPU unlike the others shows up only there."""
    engine = engine_for(settings)
    key = settings.api_key.get_secret_value() if settings.api_key else None
    return [engine.capacity(h, key) for h in handles]


@task(name="stop_servers", cache_policy=NO_CACHE, retries=0)
def stop_servers(handles: list[ServerHandle], output: str,
                 settings: JobSettings) -> StopReport | None:
    """Stop the fleet (None: servers someone else runs, never stopped)."""
    return engine_for(settings).stop(handles, Path(output), settings)
