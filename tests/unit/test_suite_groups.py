"""The suite's xdist groups hold: tests of one `xdist_group` run on one worker under the
`--dist loadgroup` that `dev.py test` passes. pytest 9.2 with xdist 3.8 broke this silently
(pytest-dev/pytest-xdist#1386): the deployment and fleet tests then ran on different workers
and took each other's flow runs. An upgrade that breaks it again fails here, by name."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

GROUPED = '''
import pytest

@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("i", range(4))
def test_grouped(i):
    pass

@pytest.mark.parametrize("i", range(4))
def test_free(i):
    pass
'''


def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup",
                           "-v", "-p", "no:cacheprovider", str(tmp_path)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    workers = set(re.findall(r"\[(gw\d+)\] .*PASSED .*test_grouped\[", proc.stdout))
    assert len(re.findall(r"PASSED .*test_grouped\[", proc.stdout)) == 4, proc.stdout[-2000:]
    assert len(workers) == 1, (f"xdist_group 'together' ran on {sorted(workers)}: --dist "
                               "loadgroup no longer groups with these pytest/pytest-xdist "
                               "versions (pytest-dev/pytest-xdist#1386)")
