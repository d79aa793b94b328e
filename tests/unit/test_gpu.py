"""nvidia-smi is read for freed GPU memory after a stop (a stand-in script plays nvidia-smi)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infra.gpu import memory_used_mib, wait_memory_released


def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines: list[str]) -> Path:
    counter = tmp_path / "calls"
    counter.write_text("0")
    script = tmp_path / "nvidia-smi"
    body = "\n".join(f"  {i}) printf '{line}\\n' ;;" for i, line in enumerate(lines))
    script.write_text("#!/bin/sh\n"
                      f'n=$(cat {counter}); echo $((n+1)) > {counter}\n'
                      f'case $n in\n{body}\n  *) printf \'{lines[-1]}\\n\' ;;\nesac\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return counter


def test_memory_is_read_per_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_smi(tmp_path, monkeypatch, ["0, 81000\\n1, 3"])
    assert memory_used_mib([0, 1]) == {0: 81000, 1: 3}


def test_waits_until_released(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counter = fake_smi(tmp_path, monkeypatch, ["0, 81000", "0, 40000", "0, 0"])
    assert wait_memory_released([0], timeout_s=10, poll_s=0.01) == {}
    assert int(counter.read_text()) == 3


def test_reports_gpus_still_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_smi(tmp_path, monkeypatch, ["0, 81000"])
    assert wait_memory_released([0], timeout_s=0.05, poll_s=0.01) == {0: 81000}


def test_without_nvidia_smi_nothing_is_claimed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert memory_used_mib([0]) is None and wait_memory_released([0]) == {}
