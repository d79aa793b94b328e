"""The fleet of one epoch as Prefect tasks — start it, wait until it answers, measure what
each server got, stop it — each carried out by the fleet's engine (tasks/engines/), so a
run's timeline shows when servers came and went."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from infra.sglang.flags import ServerFlags
from tasks.capacity import Capacity
from tasks.engines import Engine
from tasks.local_servers import ServerHandle, StopReport


@task(name="launch_servers", cache_policy=NO_CACHE, retries=0)
def launch_servers(engine: Engine, flags: ServerFlags, output: str,
                   epoch: int = 1) -> list[ServerHandle]:
    return engine.start(flags, Path(output), epoch)


@task(name="wait_healthy", cache_policy=NO_CACHE)
def wait_healthy(handles: list[ServerHandle], engine: Engine) -> float:
    """Seconds until every server answered; raises ServerStartFailed (tasks/health.py)."""
    return engine.wait_healthy(handles)


@task(name="measure_capacity", cache_policy=NO_CACHE, retries=3,
      retry_delay_seconds=[1, 2, 4])
def measure_capacity(handles: list[ServerHandle], engine: Engine) -> list[Capacity]:
    """Every server's own figures: a GPU unlike the others shows up only there."""
    return [engine.capacity(h) for h in handles]


@task(name="stop_servers", cache_policy=NO_CACHE, retries=0)
def stop_servers(handles: list[ServerHandle], output: str,
                 engine: Engine) -> StopReport | None:
    """Stop the fleet (None: servers someone else runs, never stopped)."""
    return engine.stop(handles, Path(output))
