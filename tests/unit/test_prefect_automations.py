"""The zombie automation's trigger, built without a server."""

from __future__ import annotations

from datetime import timedelta

import pytest

from infra.prefect_automations import ZOMBIE_AUTOMATION_NAME, zombie_automation


def test_trigger_expects_a_heartbeat_or_terminal_event_per_flow_run() -> None:
    automation = zombie_automation(60)
    trigger = automation.trigger
    assert automation.name == ZOMBIE_AUTOMATION_NAME
    assert trigger.posture.value == "Proactive"
    assert trigger.within == timedelta(seconds=180)  # 3 heartbeats by default
    assert trigger.after == {"prefect.flow-run.heartbeat"}
    assert {"prefect.flow-run.heartbeat", "prefect.flow-run.Completed",
            "prefect.flow-run.Crashed"} <= trigger.expect
    assert trigger.for_each == {"prefect.resource.id"}
    assert automation.actions[0].state.value == "CRASHED"


@pytest.mark.parametrize(("heartbeat", "window", "field"), [(10, None, "heartbeat_s"),
                                                           (60, 90, "window_s")])
def test_settings_prefect_cannot_honour_are_refused(heartbeat: float, window: float | None,
                                                    field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        zombie_automation(heartbeat, window)
