"""Parsers read real SGLang output across versions; absent fields are None; nothing raises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.sglang.observe import RECORD_KEYS, parse_any, parse_log, parse_log_line, parse_metrics
from tests.conftest import FIXTURES

SAMPLES = FIXTURES / "sglang-samples"


def test_the_real_samples_are_there() -> None:
    """The sample-driven tests below must not pass by having nothing to read."""
    assert (SAMPLES / "logs.txt").is_file(), f"{SAMPLES} missing"
    assert len(list((SAMPLES / "server_info").glob("*.json"))) >= 5
    assert len(list((SAMPLES / "metrics").glob("*.txt"))) >= 3


def test_hybrid_decode_line_from_the_reference() -> None:
    line = ("[2026-07-20 14:03:40] Decode batch, #running-req: 16, #full token: 76032, full "
            "token usage: 0.21, mamba num: 48, mamba usage: 0.60, accept len: 3.21, accept "
            "rate: 0.74, cuda graph: True, gen throughput (token/s): 1187.55, #queue-req: 398")
    r = parse_log_line(line)
    assert r is not None and r["kind"] == "decode"
    assert (r["running_req"], r["full_num_tokens"], r["mamba_num"]) == (16, 76032, 48)
    assert (r["full_token_usage"], r["mamba_usage"], r["accept_len"]) == (0.21, 0.60, 3.21)
    assert r["graph"] is True and r["gen_throughput"] == 1187.55 and r["queue_req"] == 398
    assert r["token_usage"] is None and r["num_tokens"] is None  # absent, not 0
    assert set(r) == set(RECORD_KEYS)


def test_hybrid_prefill_line_with_pending_tokens() -> None:
    r = parse_log_line(
        "[2026-07-20 14:02:11] Prefill batch, #new-seq: 3, #new-token: 16384, #cached-token: "
        "2048, full token usage: 0.12, mamba usage: 0.45, #running-req: 13, #queue-req: 412, "
        "#pending-token: 1830000, cuda graph: False, input throughput (token/s): 21873.40")
    assert r is not None and r["kind"] == "prefill"
    assert r["pending_token"] == 1830000 and r["mamba_usage"] == 0.45
    assert r["input_throughput"] == 21873.40 and r["graph"] is False


@pytest.mark.parametrize(("line", "rank"), [
    ("[2024-12-06 12:31:56 TP0] Decode batch. #running-req: 5, #token: 3, token usage: 0.07, "
     "gen throughput (token/s): 805.24, #queue-req: 0", "TP0"),
    ("[2025-01-01 00:00:00 DP0 TP0] Decode batch, #running-req: 5, #token: 3, token usage: "
     "0.07, gen throughput (token/s): 1.0, #queue-req: 0", "DP0 TP0"),
    ("[2025-01-01 00:00:00 DP1 TP1 EP1] Decode batch, #running-req: 5, #token: 3, token usage:"
     " 0.07, swa token usage: 0.50, npu graph: True, gen throughput (token/s): 1.0, "
     "#queue-req: 0", "DP1 TP1 EP1"),
    ("[2025-01-01 00:00:00] [gpu=0] Decode batch, #running-req: 5, #token: 3, token usage: "
     "0.07, gen throughput (token/s): 1.0, #queue-req: 0, ", "gpu=0"),
])
def test_rank_tags_and_both_separators(line: str, rank: str) -> None:
    r = parse_log_line(line)
    assert r is not None and r["rank"] == rank and r["running_req"] == 5
    assert r["queue_req"] == 0


def test_startup_mamba_kv_and_ready_lines() -> None:
    r = parse_log_line("[2026-07-20 14:00:01] max_total_num_tokens=362368, chunked_prefill_size"
                       "=16384, max_prefill_tokens=16384, max_running_requests=16, "
                       "context_len=262144, available_gpu_mem=31.02 GB")
    assert r is not None and (r["max_total_num_tokens"], r["max_running_requests"],
                              r["context_len"]) == (362368, 16, 262144)
    r = parse_log_line("[2026-07-20 14:00:00] Mamba Cache is allocated. max_mamba_cache_size: "
                       "80, conv_state size: 0.22GB, ssm_state size: 11.39GB ")
    assert r is not None and r["max_mamba_cache_size"] == 80
    r = parse_log_line("[2026-07-20 14:00:00] KV Cache is allocated. dtype: torch.bfloat16, "
                       "#tokens: 362368, K size: 11.06 GB, V size: 11.06 GB")
    assert r is not None and r["max_total_num_tokens"] == 362368
    r = parse_log_line("[2026-07-20 14:00:09] The server is fired up and ready to roll!")
    assert r is not None and r["kind"] == "ready"


def test_sample_log_file_parses() -> None:
    kind, records = parse_any((SAMPLES / "logs.txt").read_text())
    assert kind == "log"
    kinds = {r["kind"] for r in records}
    assert {"prefill", "decode", "startup", "ready"} <= kinds
    old = next(r for r in records if r["timestamp"] == "2024-12-06 12:31:56")
    assert old["gen_throughput"] == 805.24 and old["rank"] == "TP0"


@pytest.mark.parametrize("path", sorted((SAMPLES / "server_info").glob("*.json")),
                         ids=lambda p: p.name)
def test_every_server_info_version_parses(path: Path) -> None:
    kind, records = parse_any(path.read_text())
    assert kind == "server_info" and len(records) == 1
    body = json.loads(path.read_text())
    assert records[0]["version"] == body["version"]
    assert records[0]["max_total_num_tokens"] == body["max_total_num_tokens"]


def test_server_info_prefers_internal_effective_values() -> None:
    path = SAMPLES / "server_info" / "get_server_info_v0.5.10rc0_qwen2.5-0.5b_2026-03-28.json"
    body = json.loads(path.read_text())
    body["max_running_requests"] = 999
    body["internal_states"][0]["effective_max_running_requests_per_dp"] = 37
    _, (record,) = parse_any(json.dumps(body))
    assert record["max_running_requests"] == 37


@pytest.mark.parametrize("path", sorted((SAMPLES / "metrics").glob("*.txt")),
                         ids=lambda p: p.name)
def test_every_metrics_dump_parses(path: Path) -> None:
    kind, records = parse_any(path.read_text())
    assert kind == "metrics" and records
    assert all(r["mamba_usage"] is None for r in records)  # not a hybrid model


def test_metrics_rank_labels_make_separate_records() -> None:
    text = ('sglang:num_running_reqs{tp_rank="0",model_name="m"} 3\n'
            'sglang:num_running_reqs{tp_rank="1",model_name="m"} 4\n'
            'sglang:mamba_usage{tp_rank="0",model_name="m"} 0.61\n')
    records = {r["rank"]: r for r in parse_metrics(text)}
    assert records["TP0"]["running_req"] == 3 and records["TP0"]["mamba_usage"] == 0.61
    assert records["TP1"]["running_req"] == 4 and records["TP1"]["mamba_usage"] is None


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_no_text_makes_a_parser_raise(text: str) -> None:
    parse_any(text)
    parse_any("[2026-01-01 00:00:00] Decode batch, " + text)
    parse_any("# TYPE sglang:x gauge\n" + text)
    parse_any("{" + text)


DECODE = ("Decode batch, #running-req: 7, #token: 3, token usage: 0.07, mamba num: 14, "
          "mamba usage: 0.05, gen throughput (token/s): 12.5, #queue-req: 2")


@pytest.mark.parametrize(("line", "stamp", "rank"), [
    (f"[2026-12-01 12:23:09 TP0] {DECODE}", "2026-12-01 12:23:09", "TP0"),
    (f"(SGLangActor pid=4242) [2026-12-01 12:23:09 TP0] {DECODE}", "2026-12-01 12:23:09",
     "TP0"),  # Ray
    (f"sglang-1  | [2026-12-01 12:23:09] {DECODE}", "2026-12-01 12:23:09", None),  # compose
    (f"2026-12-01T12:23:09.123456789Z [2026-12-01 12:23:09 DP0 TP0] {DECODE}",
     "2026-12-01T12:23:09.123456789", "DP0 TP0"),  # kubectl logs --timestamps
    (f"Dec 01 12:23:09 gpu-node-3 python[811]: [2026-12-01 12:23:09 TP1] {DECODE}",
     "2026-12-01 12:23:09", "TP1"),  # journald: SGLang's dated stamp wins over its time
    (f"12:23:09 {DECODE}", "12:23:09", None),  # time only
    (DECODE, None, None),  # pasted alone
    (f"[gpu_id=0] {DECODE}", None, "gpu_id=0"),  # 2024 builds
])
def test_lines_are_found_behind_any_prefix(line: str, stamp: str | None,
                                           rank: str | None) -> None:
    r = parse_log_line(line)
    assert r is not None and r["kind"] == "decode"
    assert (r["running_req"], r["queue_req"], r["mamba_num"]) == (7, 2, 14)
    assert r["rank"] == rank
    assert (r["timestamp"] or "")[:19].replace("T", " ") == (stamp or "")[:19].replace("T", " ")


def test_the_2024_prefil_spelling_and_the_0517_cap_line() -> None:
    r = parse_log_line("[gpu_id=0] Prefil batch. #new-seq: 1, #new-token: 7, #cached-token: 0, "
                       "cache hit rate: 0.00%, #running-req: 0, #queue-req: 0")
    assert r is not None and r["kind"] == "prefill" and r["new_token"] == 7
    r = parse_log_line("[2026-12-01 12:18:51] max_running_requests is capped to 23 by the mamba "
                       "state cache (max_mamba_cache_size=119, 5 state slots per request). To "
                       "raise it: increase --mamba-full-memory-ratio")
    assert r is not None and r["kind"] == "startup"
    assert (r["max_running_requests"], r["max_mamba_cache_size"],
            r["mamba_slots_per_request"]) == (23, 119, 5)


def test_every_line_of_the_real_0517_logs_is_read() -> None:
    """Each Prefill/Decode line of the H200 captures gives a record, and the cap line too."""
    paths = sorted((FIXTURES / "sglang-0.5.17").glob("*.log"))
    assert len(paths) >= 5
    for path in paths:
        text = path.read_text()
        records = parse_log(text)
        batches = sum(1 for ln in text.splitlines() if " batch, #" in ln)
        assert sum(r["kind"] in ("prefill", "decode") for r in records) == batches, path.name
        if "is capped to" in text:
            assert any(r["mamba_slots_per_request"] for r in records), path.name


REAL = Path(__file__).resolve().parents[2] / "bench" / "real_sglang" / "data"


@pytest.mark.parametrize("run", [("2026-12-02-h200-s9", "long27r", "q27b_nb450_kv50k"),
                                 ("2026-12-02-h200-s13", "q27ebr", "q27b_eb300_kv50k")])
def test_retraction_lines_add_up_to_the_servers_retraction_counter(
        run: tuple[str, str, str]) -> None:
    """Real SGLang 0.5.17 servers that retracted (a KV pool too small for long outputs): each
    `KV cache pool is full. Retract requests.` line parses, and their requests sum to the
    server's own `sglang:num_retracted_requests_total` at the end of the run."""
    import gzip
    import json

    folder, plan, server = run
    log = gzip.decompress((REAL / folder / f"{plan}-{server}.log.gz").read_bytes()).decode()
    lines = [r for r in parse_log(log) if r["kind"] == "retract"]
    assert len(lines) == log.count("Retract requests.") > 0
    assert all(r["new_tokens_gained"] > 0 and r["mamba_num_gained"] is not None
               and 0 < r["new_token_ratio"] <= 1 for r in lines)
    results = json.loads(gzip.decompress((REAL / folder / f"{plan}.results.json.gz")
                                         .read_bytes()))
    counter = max(m.get("sglang:num_retracted_requests_total", 0.0)
                  for rec in results if rec["name"] == server
                  for r in rec["runs"] for m in r["metrics"])
    assert sum(r["retracted_req"] for r in lines) == counter


def test_older_releases_retraction_line_parses() -> None:
    """0.2-0.4.9 said "Decode out of memory happened." (scheduler.py of those wheels)."""
    line = ("[2024-08-01 10:00:01 TP0] Decode out of memory happened. #retracted_reqs: 1, "
            "#new_token_ratio: 0.3000 -> 0.4500")
    record = parse_log_line(line)
    assert record is not None and record["kind"] == "retract"
    assert (record["retracted_req"], record["new_token_ratio"], record["rank"]) == (1, 0.45, "TP0")
