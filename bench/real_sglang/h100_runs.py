"""What the H100 device-run tests ask of a run, once: its servers (read once per part), the
planner's committed rate for one server's flags and a workload, and a server's single run.

The CI tests of each H100 data set (tests/unit/test_real_granite_small_h100.py,
test_real_nemotron30_h100.py) compare these with what the device measured."""

from __future__ import annotations

from functools import cache
from typing import Any

import fit_h100 as fit

from infra.sim.predict import Workload, committed_tok_s


@cache
def servers(parts: tuple[tuple[str, str], ...]) -> tuple[dict[str, Any], ...]:
    return tuple(fit.servers(parts))


def planned(rec: dict[str, Any], workload: Workload) -> float:
    """What `expansion plan` commits per GPU for this server's model and flags."""
    return committed_tok_s(fit.step_model(rec["model"]), fit.H100, fit.server_flags(rec["flags"]),
                           fit.V0517, workload)


def only_run(rec: dict[str, Any]) -> dict[str, Any]:
    (run,) = rec["runs"]
    return dict(run)
