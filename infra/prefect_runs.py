"""Ad-hoc CLI runs whose process died: mark them Crashed instead of Running forever.

A flow run started by `expansion run` has no worker watching it; killed with `kill -9`, it
stays `Running` in the Prefect database and the UI lies about it. Each such run carries a tag
naming its host, pid and the pid's start time (so a reused pid is not mistaken for it); the
next `expansion run` on the same database finds the runs of this host whose process is gone
and sets them Crashed, saying why. Deployment runs (workers) are covered by the heartbeat
automation of `expansion install-automation` instead.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from infra.processes import start_ticks

TAG_PREFIX = "expansion-process:"


@dataclass(frozen=True)
class RunProcess:
    host: str
    pid: int
    ticks: int

    @property
    def gone(self) -> bool:
        return self.host == socket.gethostname() and start_ticks(self.pid) != self.ticks


def process_tag(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{TAG_PREFIX}{socket.gethostname()}:{pid}:{start_ticks(pid) or 0}"


def parse_tag(tag: str) -> RunProcess | None:
    if not tag.startswith(TAG_PREFIX):
        return None
    host, _, rest = tag.removeprefix(TAG_PREFIX).rpartition(":")
    host, _, pid = host.rpartition(":")
    if not (pid.isdigit() and rest.isdigit() and host):
        return None
    return RunProcess(host, int(pid), int(rest))


def crash_vanished_runs(flow_name: str = "generate") -> list[str]:
    """Set Crashed every Running/Pending run of `flow_name` from this host whose process is
    gone; returns their names."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    crashed = []
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
                type=FlowRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING]))))
        for run in runs:
            proc = next((p for p in map(parse_tag, run.tags or []) if p is not None), None)
            if proc is None or not proc.gone:
                continue
            client.set_flow_run_state(run.id, Crashed(
                message=f"process {proc.pid} on {proc.host} is gone (killed?); found by a "
                "later `expansion run` on this Prefect database"), force=True)
            crashed.append(run.name)
    return crashed
