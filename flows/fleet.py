"""The `generate-fleet` flow: one job across many GPU nodes, through Prefect work pools.

It fixes the shard plan on the shared output, splits the pending shards across `nodes` runs
of the `generate/expansion` deployment (one worker per GPU node picks each up; each run owns
its node's GPUs and its own tuning loop), and waits. Each node publishes its shards and its
own manifest (`manifests/<node>.jsonl`) to the shared output as it goes. When a node run
fails, crashes or is cancelled, the shards it did not publish go to new runs on the other
nodes. At the end the node manifests are merged into one `manifest.jsonl`, each shard once.
No home-made scheduler: placement, retries of the flow process and cancellation are Prefect's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from prefect import flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from prefect.runtime import flow_run
from prefect.states import Cancelled, Cancelling, State

from flows.generate import job_settings, leases_of
from infra.lease import held_lease
from infra.manifest import Manifest, make_plan
from infra.prompts import validate_input
from infra.settings import JobSettings
from infra.storage import Destination, open_destination
from tasks.upload import merge_manifests

TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def split(pending: list[int], parts: int) -> list[list[int]]:
    """Contiguous, near-equal chunks (contiguous shards read the input sequentially)."""
    parts = max(1, min(parts, len(pending)))
    size, extra = divmod(len(pending), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(pending[start:end])
        start = end
    return [c for c in out if c]


@dataclass
class NodeWatch:
    """When a node run last showed progress (a shard published), to spot one that is stuck:
    alive and heartbeating — so Prefect's zombie automation never fires — but doing nothing
    (hung GPU, a server wedged, or no worker ever picking it up)."""

    node: str
    run_id: Any
    published: int = 0
    since: float = field(default_factory=time.monotonic)
    message: str = ""  # its state's message, for the log when it ends other than COMPLETED

    def stalled(self, published: int, now: float, stall_s: float) -> bool:
        if published > self.published:
            self.published, self.since = published, now
            return False
        return stall_s > 0 and now - self.since > stall_s


def published_shards(dest: Destination, node: str) -> int:
    data = dest.get_bytes(f"manifests/{node}.jsonl")
    return len((data or b"").splitlines())


def _wait_all(watches: list[NodeWatch], poll_s: float, dest: Destination, stall_s: float,
              logger: Any) -> dict[str, str]:
    """Poll the node runs until all are terminal; cancel one that publishes nothing for
    `stall_s` (its unpublished shards go to the next round)."""
    states: dict[str, str] = {}
    check_every = max(poll_s, min(30.0, stall_s / 4)) if stall_s > 0 else math.inf
    next_check = time.monotonic() + check_every
    with get_client(sync_client=True) as client:
        while True:
            for w in watches:
                run = client.read_flow_run(w.run_id)
                states[str(w.run_id)] = run.state.type.value if run.state else "PENDING"
                w.message = (run.state.message or "") if run.state else ""
            if all(s in TERMINAL for s in states.values()):
                return states
            now = time.monotonic()
            if now >= next_check:
                next_check = now + check_every
                for w in watches:
                    state = states[str(w.run_id)]
                    if state in TERMINAL or state == "CANCELLING":
                        continue
                    if w.stalled(published_shards(dest, w.node), now, stall_s):
                        logger.warning("%s published no shard for %.0f s (state %s): "
                                       "cancelling it; its shards go to the next round",
                                       w.node, now - w.since, state)
                        message = f"no progress for {now - w.since:.0f} s (node_stall_timeout_s)"
                        # A run that never started has no process to stop: end it at once.
                        new: State[Any] = (Cancelling(message=message) if state == "RUNNING"
                                            else Cancelled(message=message))
                        client.set_flow_run_state(w.run_id, new, force=True)
            time.sleep(poll_s)


@flow(name="generate-fleet")
def generate_fleet(output: str, prompts: str | None = None, nodes: int = 2,
                   deployment: str = "generate/expansion", gpus: list[int] | None = None,
                   overrides: dict[str, Any] | None = None, node_port_stride: int = 0,
                   max_rounds: int = 4, poll_s: float = 2.0,
                   node_stall_timeout_s: float = 3600.0) -> dict[str, Any]:
    """Spread one job over `nodes` runs of the generate deployment; survive losing a node.

    A node run that publishes no shard for `node_stall_timeout_s` (start-up included; 0 turns
    the watchdog off) is cancelled, and its shards go to the next round."""
    settings = job_settings(prompts, output, None, gpus, None, None, overrides)
    root, beside = leases_of(settings, None)
    with held_lease(root, str(flow_run.name or ""), settings.force_takeover, beside):
        return _spread(settings, Spread(nodes, deployment, gpus, overrides, node_port_stride,
                                        max_rounds, poll_s, node_stall_timeout_s))


@dataclass(frozen=True)
class Spread:
    """How generate-fleet spreads a job: its parameters beside the job's settings."""

    nodes: int
    deployment: str
    gpus: list[int] | None
    overrides: dict[str, Any] | None
    node_port_stride: int
    max_rounds: int
    poll_s: float
    node_stall_timeout_s: float


def _spread(settings: JobSettings, spread: Spread) -> dict[str, Any]:
    """The rounds of node runs, once this run holds the output's lease (and the bucket's)."""
    logger = get_run_logger()
    nodes, deployment, gpus, overrides = (spread.nodes, spread.deployment, spread.gpus,
                                          spread.overrides)
    node_port_stride, max_rounds, poll_s, node_stall_timeout_s = (
        spread.node_port_stride, spread.max_rounds, spread.poll_s, spread.node_stall_timeout_s)
    root = settings.local_output()
    dest = open_destination(settings.upload_target() or str(root),
                            settings.storage.endpoint_url, settings.storage.region,
                            settings.storage.multipart_mb)
    shard_plan = Manifest(root).init_plan(make_plan(validate_input(settings.prompts),
                                                  settings.shard_size))
    dest.put_bytes((root / "plan.json").read_bytes(), "plan.json")
    committed = {e.shard for e in merge_manifests(dest)}
    pending = [s for s in range(shard_plan.num_shards) if s not in committed]
    logger.info("plan %s: %d shards, %d pending, %d nodes", shard_plan.fingerprint,
                shard_plan.num_shards, len(pending), nodes)
    rounds: list[dict[str, Any]] = []
    base_port = settings.base_port
    for round_no in range(max_rounds):
        if not pending:
            break
        runs = []
        for i, chunk in enumerate(split(pending, nodes)):
            node = f"node-{i}-r{round_no}"
            params = {"prompts": str(settings.prompts), "output": settings.output, "gpus": gpus,
                      "overrides": {**(overrides or {}), "base_port":
                                    base_port + node_port_stride * (round_no * nodes + i)},
                      "shards": chunk, "node": node}
            run = run_deployment(deployment, parameters=params, timeout=0, as_subflow=True,
                                 flow_run_name=f"{node}-{len(chunk)}-shards")
            assert isinstance(run, FlowRun)  # sync context: not a coroutine
            runs.append((node, run.id, chunk))
            logger.info("%s: %d shards (%d–%d) → flow run %s", node, len(chunk), chunk[0],
                        chunk[-1], run.id)
        watches = [NodeWatch(node, rid) for node, rid, _ in runs]
        states = _wait_all(watches, poll_s, dest, node_stall_timeout_s, logger)
        why = {w.node: f" ({w.message.splitlines()[0]})" if w.message else "" for w in watches}
        committed = {e.shard for e in merge_manifests(dest)}
        pending = [s for s in range(shard_plan.num_shards) if s not in committed]
        lost = {node: states[str(rid)] for node, rid, _ in runs
                if states[str(rid)] != "COMPLETED"}
        rounds.append({"round": round_no, "states": {n: states[str(r)] for n, r, _ in runs},
                       "flow_runs": {n: str(r) for n, r, _ in runs},
                       "pending_after": len(pending)})
        if lost:
            logger.warning("round %d: %s; %d shards go to the other nodes", round_no,
                           ", ".join(f"{n} {s}{why[n]}" for n, s in lost.items()),
                           len(pending))
    if pending:
        raise RuntimeError(f"{len(pending)} shards still pending after {max_rounds} rounds; "
                           "check the node runs' logs, then rerun generate-fleet to resume")
    merged = merge_manifests(dest)
    return {"output": dest.label, "shards": len(merged),
            "rows": sum(e.rows for e in merged), "errors": sum(e.errors for e in merged),
            "rounds": rounds}
