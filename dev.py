#!/usr/bin/env python3
"""Bootstrap and run: `python3 dev.py demo` (the main job) or `python3 dev.py test` (all tests).

Needs only Python 3.11 and pip: installs uv if it is missing, creates .venv from uv.lock
(sglang is left out: it is the `sglang` extra for GPU nodes), then runs the command.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
DEMO_OUTPUT = ROOT / "expansion-output" / "demo"


def uv() -> list[str]:
    found = shutil.which("uv")
    if found:
        return [found]
    probe = subprocess.run([sys.executable, "-m", "uv", "--version"], capture_output=True)
    if probe.returncode != 0:
        print("dev.py: installing uv with pip ...", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "uv"], check=True)
    return [sys.executable, "-m", "uv"]


def sync(cmd: list[str]) -> None:
    """Install from uv.lock with bytecode compiled once, here. uv leaves it out by default,
    and where PYTHONDONTWRITEBYTECODE is set (CI, this project's boxes) every process then
    compiled Prefect anew: `import prefect.server.api.server` 12.7 s instead of 7.6 s, a
    Prefect server healthy after 20 s instead of 10 — for every CLI run, worker and server
    the tests start. The project's own modules are compiled too (tiny, but imported by all)."""
    subprocess.run([*cmd, "sync", "--frozen", "--quiet", "--compile-bytecode"], cwd=ROOT,
                   check=True)
    python = ROOT / ".venv" / "bin" / "python"
    subprocess.run([str(python), "-m", "compileall", "-q", "-j", "0",
                    *(str(ROOT / d) for d in ("flows", "tasks", "infra", "bench"))],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("demo", "test"):
        print(__doc__)
        return 2
    cmd = uv()
    sync(cmd)
    # UV_COMPILE_BYTECODE: `uv run` re-syncs when the lock changed; keep the bytecode then too.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "UV_COMPILE_BYTECODE": "1"}
    if argv[0] == "demo":
        if DEMO_OUTPUT.exists():
            print(f"dev.py: removing the previous demo output {DEMO_OUTPUT}")
            shutil.rmtree(DEMO_OUTPUT)
        run = [*cmd, "run", "--frozen", "expansion", "run", "--output", str(DEMO_OUTPUT),
               *argv[1:]]
    else:
        # 3 workers on 2 cores: the end-to-end tests spend much of their time waiting on
        # servers and Prefect (measured: 12.9–15.2 min against 16.8 min with 2 workers).
        default = ["-n", "3", "--dist", "loadgroup", "--durations", "15"]
        run = [*cmd, "run", "--frozen", "pytest", *(argv[1:] or default)]
    return subprocess.run(run, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
