"""The CLI's Prefect defaults are in force: Prefect reads its settings once, at import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_cli_sets_prefect_defaults_before_prefect_reads_them() -> None:
    probe = ("import expansion.cli, flows.generate\n"
             "from prefect.settings import get_current_settings\n"
             "print(get_current_settings().server.ephemeral.startup_timeout_seconds)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "300"  # not Prefect's 20 s, too short on a loaded machine
