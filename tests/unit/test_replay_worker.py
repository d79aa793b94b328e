"""Replays in a child process: the same answer as in-process, errors named, no child left."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.sglang.flag_parser import parse_server_flags
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.versions import parse_version
from infra.sim.replay import replay_requests
from infra.sim.replay_worker import ReplayWorker

MODEL = Path(__file__).resolve().parents[1] / "fixtures" / "models" / "qwen3.6-27b-text"


def test_the_worker_answers_as_the_replay_does_and_exits_when_stopped() -> None:
    args = (model_profile(str(MODEL), 50.16), gpu_profile("h200"),
            parse_server_flags(["--mamba-radix-cache-strategy", "no_buffer"]),
            parse_version("0.5.17"), [(512, 64)] * 200, 90)
    worker = ReplayWorker()
    try:
        assert worker.replay(*args) == replay_requests(*args)
        with pytest.raises(RuntimeError, match="replay failed in the worker: "):
            worker.replay(*args[:4], [(512, 64)], "not a number")
        proc = worker._proc
        assert proc is not None and proc.poll() is None
    finally:
        worker.stop()
    assert proc.poll() is not None and worker._proc is None


def test_a_worker_that_died_is_started_again() -> None:
    args = (model_profile(str(MODEL), 50.16), gpu_profile("h200"), parse_server_flags([]),
            parse_version("0.5.17"), [(64, 8)] * 20, 10)
    worker = ReplayWorker()
    try:
        first = worker.replay(*args)
        assert worker._proc is not None
        worker._proc.kill()
        worker._proc.wait()
        assert worker.replay(*args) == first
    finally:
        worker.stop()
