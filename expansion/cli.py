"""`expansion`: run the generate flow ad hoc, plan server memory, inspect outputs and logs.

The commands live by topic in `cli_run.py` (a job), `cli_plan.py` (memory plans, files and
live servers) and `cli_tools.py` (the simulator, Prefect setup); importing them registers
them on the one Typer app. Prefect is imported lazily so `expansion plan --help` stays fast.
"""

from __future__ import annotations

import sys

from expansion import cli_plan, cli_run, cli_tools  # noqa: F401  (registers the commands)
from expansion.cli_common import app


def main() -> None:
    try:
        app()
    except BrokenPipeError:
        sys.exit(0)


if __name__ == "__main__":
    main()
