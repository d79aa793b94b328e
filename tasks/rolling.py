"""Replace the servers of a running fleet one at a time while the others keep generating.

The canary and the rolling restart of tasks/tuning/canary.py are built from one move:
take server i out of dispatch (its in-flight requests may finish), stop it, start it again
with other flags on the same GPU and port, wait until it is healthy, measure what it got and
admit it with its new limit. Nothing is lost: a request still running when the server stops
fails over to another server, and a shard is only committed when all its rows are in.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from infra.gpu import wait_memory_released
from infra.processes import is_ours_and_alive
from infra.settings import JobSettings
from tasks.capacity import Capacity
from tasks.dispatch import Endpoint
from tasks.engines import Engine, LocalServers
from tasks.fleet_config import FleetConfig
from tasks.fleet_control import FleetControl
from tasks.health import StartAborted
from tasks.local_servers import LaunchError, ServerHandle
from tasks.shards import endpoint_of


@dataclass(frozen=True)
class Replaced:
    index: int
    capacity: Capacity
    out_s: float  # retire → admitted again: the time this server did not take work
    startup_s: float
    failed_over: int  # requests still in flight when it stopped (redone elsewhere)
    restarted: bool = True  # False: only the client limit changed


class RollingFleet:
    """The servers of one epoch as they change; `handles()` is what the epoch stops."""

    def __init__(self, handles: list[ServerHandle], engine: Engine, settings: JobSettings,
                 out: Path, epoch: int, logger: Any) -> None:
        self.engine = engine
        self._handles = {h.index: h for h in handles}
        self.capacity_of: dict[int, Capacity] = {}
        self.job = settings  # the job's facts (drain timeout, servers per GPU, queue target)
        self.config_of = {h.index: FleetConfig.of(settings) for h in handles}  # what each runs
        self.out = out
        self.epoch = epoch
        self.control = FleetControl()  # servers leave and join the running dispatch
        self.logger = logger
        self.abort = threading.Event()  # set when the epoch ends: no replacement starts after
        self.last_join = time.monotonic()  # when a server last (re)joined dispatch
        self._lock = threading.Lock()

    def handles(self) -> list[ServerHandle]:
        with self._lock:
            return [self._handles[i] for i in sorted(self._handles)]

    def handle(self, index: int) -> ServerHandle:
        with self._lock:
            return self._handles[index]

    def dead(self) -> list[int]:
        """Servers whose process is gone (crashed, killed, OOM): the exit is read from the
        process table, not from scrapes, so a busy server that answers slowly is not one."""
        with self._lock:
            return [i for i, h in sorted(self._handles.items())
                    if not is_ours_and_alive(h.record)]

    def capacities(self) -> list[Capacity]:
        with self._lock:
            return [self.capacity_of[i] for i in sorted(self.capacity_of)]

    def replace(self, index: int, config: FleetConfig, tag: str,
                force: bool = False) -> Replaced:
        """Restart server `index` on `config` (with the same server flags only when `force`:
        otherwise the client limit changes in place); raises ServerStartFailed (the server is
        then down and out of dispatch: the caller restores a known config)."""
        started = time.monotonic()
        if not force and config.flags == self.config_of[index].flags and index in self.capacity_of:
            return self._relimit(index, config)
        with self.control.restarting():
            return self._restart(index, config, tag, started)

    def _endpoint(self, config: FleetConfig, cap: Capacity) -> Endpoint:
        return endpoint_of(config, self.job.client.queue_target, cap)

    def _restart(self, index: int, config: FleetConfig, tag: str,
                 started: float) -> Replaced:
        name = f"server-{index}"
        self.control.retire(name)
        left = self.control.wait_drained(name, self.job.tuning.drain_timeout_s)
        engine = _own_engine(self.engine)
        engine.stop_one(self._handles[index], self.out)
        if engine.checks_gpu_memory_after_stop and self.job.servers_per_gpu == 1:
            wait_memory_released([self._handles[index].gpu])
        if self.abort.is_set():
            raise StartAborted(f"{name}: not restarted, the epoch is ending",
                               self._handles[index], "")
        spec = engine.launch_specs(config.flags, self.out, self.epoch)[index]
        log = spec.log_path.with_name(spec.log_path.name.replace(".log", f".{tag}.log"))
        handle = engine.start_one(replace(spec, log_path=log), config.flags, self.out)
        with self._lock:  # from here the epoch's stop must find the new process
            self._handles[index] = handle
            self.config_of[index] = config
        startup = engine.wait_healthy([handle], abort=self.abort)
        cap = engine.capacity(handle)
        with self._lock:
            self.capacity_of[index] = cap
        self.control.join(self._endpoint(config, cap))
        self.last_join = time.monotonic()
        out_s = time.monotonic() - started
        self.logger.info("%s restarted as %s (%s): healthy after %.0f s, cap %d, out of "
                         "dispatch %.0f s, %d in-flight request(s) failed over", name, tag,
                         config.flags.fingerprint(), startup, cap.max_running_requests,
                         out_s, left)
        return Replaced(index, cap, out_s, startup, left)

    def _relimit(self, index: int, config: FleetConfig) -> Replaced:
        """Same server flags, other client concurrency: no restart, new workers."""
        with self._lock:
            self.config_of[index] = config
            cap = self.capacity_of[index]
        endpoint = self._endpoint(config, cap)
        self.control.join(endpoint)
        self.logger.info("server-%d: client limit now %s (no restart needed)", index,
                         endpoint.limit)
        return Replaced(index, cap, 0.0, 0.0, 0, restarted=False)


def _own_engine(engine: Engine) -> LocalServers:
    """The engine of servers this job runs itself: only those are restarted."""
    if not isinstance(engine, LocalServers):
        raise LaunchError(f"engine={engine.name}: this job does not restart these servers")
    return engine
