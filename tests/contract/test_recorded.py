"""Real SGLang 0.5.17 output, recorded on the H200, meets the contract the pipeline relies on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.contract.checks import (
    check_generate,
    check_log,
    check_metrics,
    check_server_info,
)

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-0.5.17"
STRATEGIES = ["no_buffer", "extra_buffer"]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("path", ["server_info", "get_server_info"])
def test_server_info(strategy: str, path: str) -> None:
    check_server_info(json.loads((REAL / f"{strategy}.{path}.json").read_text()))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("when", ["idle", "after-load"])
def test_metrics(strategy: str, when: str) -> None:
    check_metrics((REAL / f"{strategy}.metrics-{when}.txt").read_text())


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_generate_with_input_ids(strategy: str) -> None:
    body = json.loads((REAL / f"{strategy}.generate.json").read_text())
    check_generate(body, max_new_tokens=8, tokenized=True, ignore_eos=True)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_server_log(strategy: str) -> None:
    check_log((REAL / f"{strategy}.server.log").read_text())


def test_a_check_fails_on_what_sglang_would_not_send() -> None:
    """The checks can fail: a body without the effective cap is refused."""
    body = json.loads((REAL / "no_buffer.server_info.json").read_text())
    body["internal_states"][0].pop("effective_max_running_requests_per_dp")
    with pytest.raises(AssertionError, match="effective cap"):
        check_server_info(body)
