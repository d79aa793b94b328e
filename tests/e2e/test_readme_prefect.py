"""The README's Prefect block, pasted as it is into a fresh shell, ends with a Completed run.

The block is read from README.md (not copied here), so the README cannot drift from what
works: a real `prefect server`, the real deploy, a real process worker, the deployment run
with `--watch`. Only the port (4200 → a free one) and PREFECT_HOME are the test's own.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import free_port_block
from tests.session import migrated_home

ROOT = Path(__file__).resolve().parents[2]


def readme_prefect_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Prefect"):]
    match = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert match, "README's Prefect section has no bash block"
    return match.group(1)


def test_block_is_the_documented_sequence() -> None:
    block = readme_prefect_block()
    order = ["source .venv/bin/activate", "prefect server start", "expansion setup-prefect",
             "prefect --no-prompt deploy", "prefect worker start",
             "prefect deployment run generate/expansion"]
    positions = [block.index(step) for step in order]
    assert positions == sorted(positions)


def end_group(pgid: int, grace_s: float = 15.0) -> None:
    """SIGTERM the block's process group (the worker's first SIGTERM is a graceful stop),
    then SIGKILL whatever is left after `grace_s`: a worker left running outlived the run
    (the run's leak check found it twice)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


@pytest.mark.slow
def test_readme_prefect_block_runs_as_pasted(tmp_path: Path) -> None:
    port = free_port_block(1)
    block = readme_prefect_block().replace("127.0.0.1:4200", f"127.0.0.1:{port}")
    block = block.replace("prefect server start --background",
                          f"prefect server start --background --port {port}")
    script = tmp_path / "block.sh"
    script.write_text("set -euo pipefail\n" + block)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "VIRTUAL_"))}
    # A new home with a migrated, empty database (tests/session.py): what a user's first
    # `prefect server start` builds in 19 s idle took over 120 s under the suite's load.
    home = migrated_home(tmp_path / "prefect-home")
    env.update(PREFECT_HOME=str(home), PREFECT_WORKER_QUERY_SECONDS="2")
    output = ROOT / "expansion-output" / "prefect"
    shutil.rmtree(output, ignore_errors=True)
    proc = subprocess.Popen(["bash", str(script)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=420)
    except subprocess.TimeoutExpired as exc:  # say where the block stood, not only that it hung
        out = (exc.output or b"").decode(errors="replace") if isinstance(exc.output, bytes) \
            else (exc.output or "")
        out += "\n[the block did not finish within 420 s]"
    finally:
        with_stop = {**env, "PREFECT_API_URL": f"http://127.0.0.1:{port}/api"}
        end_group(proc.pid)  # the block's background worker, before its server goes
        subprocess.run([str(ROOT / ".venv" / "bin" / "prefect"), "server", "stop"],
                       env=with_stop, capture_output=True, timeout=60)
    # the background server's own log, for a failure that is the server's (once, under a
    # full suite on two cores: the CLI's --watch got "All connection attempts failed")
    server_log = "".join(f"\n--- {p}\n{p.read_text(errors='replace')[-2000:]}"
                         for p in sorted((tmp_path / "prefect-home").rglob("*.log")))
    assert proc.returncode == 0, out[-3000:] + server_log + _worker_log()
    assert "Completed" in out, out[-3000:] + server_log
    assert len((output / "manifest.jsonl").read_text().splitlines()) == 6  # 600 / 100
    shutil.rmtree(output, ignore_errors=True)


def _worker_log() -> str:
    """The block's worker writes to /tmp/expansion-worker.log (as the README says)."""
    path = Path("/tmp/expansion-worker.log")
    return f"\n--- {path}\n{path.read_text(errors='replace')[-3000:]}" if path.exists() else ""
