"""The Prefect automation that turns a vanished flow run into `Crashed` (a "zombie").

A node that loses power or network leaves its run `Running` forever: nothing reports the
crash, so `generate-fleet` would wait on that node's round and `prefect flow-run retry`
refuses a non-terminal run. Prefect's documented answer (docs.prefect.io/v3/advanced/
detect-zombie-flows) is a proactive trigger: after a `prefect.flow-run.heartbeat`, expect
another heartbeat or a terminal event within a window, per flow run; if none comes, set the
run `Crashed`. Heartbeats are sent every PREFECT_FLOWS_HEARTBEAT_FREQUENCY seconds (the
`expansion` deployment sets 60); the window should be ≥ 3 heartbeats (prefect-notes: a
window too close to the interval gives false positives).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

ZOMBIE_AUTOMATION_NAME = "expansion: crash flow runs that stopped sending heartbeats"
TERMINAL_EVENTS = ("Completed", "Failed", "Cancelled", "Crashed")


def zombie_automation(heartbeat_s: float, window_s: float | None = None) -> Any:
    """The automation object (not yet created). Raises ValueError for a window too short."""
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    if heartbeat_s < 30:
        raise ValueError("heartbeat_s: Prefect sends flow-run heartbeats at most every 30 s; "
                         "use 30 or more (and the same as PREFECT_FLOWS_HEARTBEAT_FREQUENCY)")
    window = window_s if window_s is not None else 3 * heartbeat_s
    if window < 2 * heartbeat_s:
        raise ValueError(f"window_s: {window:g} s is under two heartbeats ({heartbeat_s:g} s "
                         "each); a late heartbeat would crash a healthy run — use ≥ 3×")
    return Automation(
        name=ZOMBIE_AUTOMATION_NAME,
        description=(f"Set a flow run Crashed when no heartbeat or terminal event follows a "
                     f"heartbeat within {window:g} s (heartbeats every {heartbeat_s:g} s). "
                     "Installed by `expansion install-automation`."),
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat",
                    *(f"prefect.flow-run.{state}" for state in TERMINAL_EVENTS)},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=window),
        ),
        actions=[ChangeFlowRunState(
            state=StateType.CRASHED,
            message=f"no heartbeat for {window:g} s: the flow run's process or host is gone")],
    )


def install_zombie_automation(heartbeat_s: float, window_s: float | None = None,
                              ) -> tuple[str, Any]:
    """Create the automation, or bring an existing one (same name) up to these settings.
    Returns ("created" | "updated", automation)."""
    from prefect.automations import Automation

    wanted = zombie_automation(heartbeat_s, window_s)
    try:
        existing: Any = Automation.read(name=ZOMBIE_AUTOMATION_NAME)  # sync: no event loop
    except ValueError:  # Prefect's "not found"
        return "created", wanted.create()
    wanted.id = existing.id
    wanted.update()
    return "updated", wanted
