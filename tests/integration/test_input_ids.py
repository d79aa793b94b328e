"""Pre-tokenized prompts: what a `--skip-tokenizer-init` SGLang server takes and answers.

The real answer shapes come from SGLang 0.5.17 on the H200 (tests/fixtures/sglang-0.5.17/);
the simulator is held to them, and the dispatcher reads both the same way.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import httpx
import polars as pl
import pytest

from infra.prompt_row import PromptRow
from tasks.dispatch import DispatchOptions
from tasks.requests import build_request, parse_response

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REAL = FIXTURES / "sglang-0.5.17"
MODEL_27B = FIXTURES / "models" / "qwen3.6-27b-text"


def opts(**sampling: object) -> DispatchOptions:
    base = {"max_new_tokens": 8, "temperature": 0.0, "top_p": 1.0, "seed": None}
    return DispatchOptions(model="m", api_key=None, sampling={**base, **sampling},
                           request_timeout_s=5, max_attempts=1, backoff_s=0.1)


def test_input_ids_row_becomes_a_native_request() -> None:
    path, body = build_request(PromptRow("a", input_ids=[5, 6, 7]), opts(ignore_eos=True))
    assert path == "/generate"
    assert body == {"input_ids": [5, 6, 7], "sampling_params": {
        "max_new_tokens": 8, "temperature": 0.0, "top_p": 1.0, "ignore_eos": True}}


def test_real_tokens_only_answer_is_read() -> None:
    real = json.loads((REAL / "no_buffer.generate.json").read_text())
    assert "text" not in real  # what --skip-tokenizer-init really answers
    fields = parse_response("/generate", real)
    assert fields["completion"] is None
    assert fields["output_ids"] == real["output_ids"]
    assert fields["completion_tokens"] == len(real["output_ids"]) == 8
    assert fields["finish_reason"] == "length"


def test_sim_answers_like_a_skip_tokenizer_server(sim_fleet) -> None:
    (h,) = sim_fleet(1, model=str(MODEL_27B), weights_gib=50.16, **{
        "server.extra_args": ["--skip-tokenizer-init"], "sim.gpu": "h200"})
    body = httpx.post(f"{h.url}/generate", json={
        "input_ids": [11, 12, 13, 14], "sampling_params": {"max_new_tokens": 8,
                                                             "ignore_eos": True}}).json()
    real = json.loads((REAL / "no_buffer.generate.json").read_text())
    assert set(body) == set(real) == {"output_ids", "meta_info"}
    assert body["meta_info"]["prompt_tokens"] == 4
    assert body["meta_info"]["completion_tokens"] == 8  # ignore_eos: always max_new_tokens
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 8}
    text = httpx.post(f"{h.url}/generate", json={"text": "hi"})
    assert text.status_code == 400 and "input_ids" in text.json()["error"]["message"]
    bad = httpx.post(f"{h.url}/generate", json={"input_ids": ["x"]})
    assert bad.status_code == 400 and "input_ids" in bad.json()["error"]["message"]


def test_sim_dies_on_a_token_outside_the_vocabulary_as_real_sglang_does(sim_fleet) -> None:
    """Real 0.5.17 indexes past its embedding table and the scheduler dies, taking the
    server with it; the simulator does the same, never a 200 or a 400."""
    (h,) = sim_fleet(1, model=str(MODEL_27B), weights_gib=50.16, **{
        "server.extra_args": ["--skip-tokenizer-init"], "sim.gpu": "h200"})
    with pytest.raises(httpx.TransportError):
        httpx.post(f"{h.url}/generate", json={"input_ids": [11, 248320], "sampling_params": {
            "max_new_tokens": 8}}, timeout=10)
    deadline = time.monotonic() + 10
    pid = status = 0
    while pid == 0 and time.monotonic() < deadline:  # our child: its exit status is ours
        pid, status = os.waitpid(h.record.pid, os.WNOHANG)
        time.sleep(0.05)
    assert pid == h.record.pid and os.waitstatus_to_exitcode(status) == 1
    assert "device-side assert triggered" in Path(h.log_path).read_text()


def test_a_row_outside_the_vocabulary_is_an_error_and_never_sent() -> None:
    from tasks.requests import unsendable

    checked = replace(opts(), vocab_size=248320)
    assert unsendable(PromptRow("a", input_ids=[0, 248319]), checked) is None
    why = unsendable(PromptRow("a", input_ids=[5, 248320, 7]), checked)
    assert why is not None and why.startswith("input_ids[1]: token id 248320 is outside")
    assert "0..248319" in why
    assert unsendable(PromptRow("a", input_ids=[-1]), checked) is not None
    assert unsendable(PromptRow("a", input_ids=[248320]), opts()) is None  # vocab unknown


@pytest.mark.slow
def test_flow_runs_pre_tokenized_prompts(prefect_api: None, tmp_path: Path) -> None:
    """One row carries an id past the vocabulary (it would kill a real server, and the next
    one it was retried on): the run warns before it starts, records that row as an error, and
    answers every other row once."""
    from flows.generate import generate, preflight
    from infra.settings import load_settings
    from tests.conftest import free_port_block

    src = tmp_path / "ids.jsonl"
    rows = [{"id": f"p{i}", "input_ids": [i + 3] * (8 + i % 5)} for i in range(120)]
    rows[57]["input_ids"] = [5, 250000, 6]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    warnings = preflight(load_settings(None, prompts=str(src), model=str(MODEL_27B),
                                       weights_gib=50.16, **{"sim.gpu": "h200"}))
    assert any("1 rows carry token ids outside the model's vocabulary (0..248319; the first: "
               "id 'p57')" in w for w in warnings), warnings
    summary = generate(prompts=str(src), output=str(tmp_path / "out"), gpus=[0],
                       model=str(MODEL_27B), overrides={
                           "base_port": free_port_block(1), "weights_gib": 50.16,
                           "sim.gpu": "h200", "sim.startup_s": 0.2, "sim.time_scale": 500.0,
                           "sampling.max_new_tokens": 16, "sampling.ignore_eos": True,
                           "server.extra_args": ["--skip-tokenizer-init"], "shard_size": 40,
                           "stop_grace_s": 5.0, "tuning.enabled": False})
    assert summary["prompts_done_this_run"] == 119 and summary["errors_this_run"] == 1
    shards = pl.read_parquet(tmp_path / "out" / "shards" / "*.parquet")
    assert shards["completion"].null_count() == 119 and "p57" not in shards["id"].to_list()
    errors = pl.read_parquet(tmp_path / "out" / "errors" / "*.parquet")
    assert errors["id"].to_list() == ["p57"]
    assert errors["error"][0].startswith("input_ids[1]: token id 250000 is outside")
    assert shards["output_ids"].list.len().to_list() == [16] * 119
    assert sorted(shards["id"].to_list()) == sorted(f"p{i}" for i in range(120) if i != 57)


def test_real_shard_from_the_h200_run_has_the_same_columns() -> None:
    real = pl.read_parquet(REAL / "shard-input-ids.parquet")
    assert real.height == 100 and real["completion"].null_count() == 100
    assert real["output_ids"].list.len().to_list() == [128] * 100
    assert {"id", "input_ids", "output_ids", "completion_tokens", "server", "config"} <= set(
        real.columns)
