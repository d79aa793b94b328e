"""The suspect lane (tasks/suspects.py): prompts a dying server was running ride one per
server, and a prompt implicated in two deaths is quarantined."""

from __future__ import annotations

from infra.prompt_row import PromptRow
from tasks.dispatch_records import WorkItem
from tasks.suspects import SuspectLane, quarantined


def item(*killed: str) -> WorkItem:
    return WorkItem(0, 0, PromptRow.from_columns({"id": "r1", "prompt": "p"}), killed=list(killed))


def test_a_suspect_runs_only_where_no_other_suspect_runs() -> None:
    lane = SuspectLane()
    first, second, innocent = item("server-0"), item("server-0"), item()
    assert lane.may_run("server-1", first)
    counted = lane.started("server-1", first)
    assert not lane.may_run("server-1", second)  # would share the next death's blame
    assert lane.may_run("server-2", second)
    assert lane.may_run("server-1", innocent)  # prompts never implicated ride anywhere
    lane.ended("server-1", counted)
    assert lane.may_run("server-1", second)


def test_a_prompt_that_becomes_a_suspect_while_running_is_not_uncounted() -> None:
    """It was not counted when it started; its server's death makes it a suspect before it
    ends — the lane must not take away a count it never added."""
    lane = SuspectLane()
    running = item()
    counted = lane.started("server-1", running)
    running.killed.append("server-1")
    lane.ended("server-1", counted)
    assert lane.may_run("server-1", item("server-3"))


def test_two_deaths_quarantine_and_the_reason_names_both_servers() -> None:
    assert quarantined(item("server-0")) is None
    reason = quarantined(item("server-0", "server-2"))
    assert reason is not None and reason.startswith("killed the server twice")
    assert "server-0, server-2" in reason
