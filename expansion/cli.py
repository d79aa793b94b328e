"""`expansion`: run the generate flow ad hoc, plan server memory, inspect outputs and logs.

The commands live by topic in `cli_run.py` (a job), `cli_plan.py` (memory plans, files and
live servers) and `cli_tools.py` (the simulator, Prefect setup); importing them registers
them on the one Typer app. Prefect is imported lazily so `expansion plan --help` stays fast.
"""

from __future__ import annotations

import sys

from infra.prefect_env import configure_local_prefect

# Before anything imports Prefect: it reads its settings once, at import. (The flow module
# was imported before these defaults were set, so a loaded machine met Prefect's 20 s
# ephemeral-start timeout instead of ours.)
configure_local_prefect()

from expansion import cli_plan, cli_run, cli_tools  # noqa: E402, F401  (registers commands)
from expansion.cli_common import app  # noqa: E402


def main() -> None:
    try:
        app()
    except BrokenPipeError:
        sys.exit(0)


if __name__ == "__main__":
    main()
