"""Parsers for what a running SGLang server tells us: log lines, /server_info, /metrics.

Every parser returns records with the same keys (RECORD_KEYS); a field the source does not
carry is None, never 0. Formats drift across versions (`.` vs `,` after "Decode batch", rank
tags, hybrid fields), so lines are parsed as `key: value` lists, not fixed patterns.
Prometheus text goes through prometheus_client's parser. No input makes these raise.
"""

from __future__ import annotations

import json
import re
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from infra.sglang.server_info import parse_server_info

RECORD_KEYS = (
    "kind", "timestamp", "rank", "running_req", "queue_req", "token_usage", "full_token_usage",
    "swa_token_usage", "mamba_usage", "mamba_num", "num_tokens", "full_num_tokens",
    "swa_num_tokens",
    "gen_throughput", "input_throughput", "new_seq", "new_token", "cached_token", "accept_len",
    "accept_rate", "graph", "pending_token", "max_total_num_tokens", "max_running_requests",
    "max_mamba_cache_size", "mamba_slots_per_request", "context_len", "version",
    "retracted_req", "paused_req", "cache_hit_rate", "new_tokens_gained", "mamba_num_gained",
    "new_token_ratio",
)
READY_LINE = "The server is fired up and ready to roll!"

# What SGLang says, found wherever it stands in a line: behind its own `[date time TP0]`
# prefix, a wrapper's (Ray `(Actor pid=N)`, docker compose `svc  |`, kubectl, journald), or
# none. "Prefil batch" is how builds of 2024 spelled it.
_MESSAGE = re.compile(
    r"(?P<msg>(?:Prefill|Prefil|Decode) batch\b.*|max_total_num_tokens=.*"
    r"|Mamba Cache is allocated.*|KV Cache is allocated.*|max_running_requests is capped to.*"
    r"|Decode out of memory happened\..*|KV cache pool is full\. Retract requests\..*"
    r"|The server is fired up and ready to roll!)$")
_STAMP = re.compile(r"(?P<ts>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?)")
_TIME_ONLY = re.compile(r"(?P<ts>\b\d{2}:\d{2}:\d{2}(?:[.,]\d+)?)")
_RANK_TAG = re.compile(r"\b(?:(?:DP|TP|PP|EP)\d+|(?:gpu|GPU|gpu_id)=\d+)\b")
# 0.2-0.3 put a mixed batch's running count in the header: "Prefill batch(mixed #running-req:
# 4). #new-seq: …"
_BATCH = re.compile(r"^(?P<kind>Prefill|Prefil|Decode) batch(?: \[\d+\])?"
                    r"(?:\(mixed (?P<mixed>#running-req: \d+)\))?[.,]\s*(?P<rest>.*)$")
_CAPPED = re.compile(r"capped to (?P<cap>\d+) by the mamba state cache "
                     r"\(max_mamba_cache_size=(?P<slots>\d+), (?P<per>\d+) state slots")
_KV_PAIR = re.compile(r"^\s*(?P<key>[#A-Za-z][^:]*?)\s*:\s*(?P<value>.+?)\s*$")
_EQ_PAIR = re.compile(r"(?P<key>[a-z_]+)=(?P<value>[^,\s]+)")
_MAMBA_SIZE = re.compile(r"max_mamba_cache_size:\s*(\d+)")
_KV_TOKENS = re.compile(r"#tokens:\s*(\d+)")
# A decode batch the KV (or, since 0.5.10, mamba) pool could not hold: the scheduler took
# requests back. 0.2-0.4.9: "Decode out of memory happened. #retracted_reqs: N, #new_token_ratio:
# a -> b"; 0.4.10 on: "KV cache pool is full. Retract requests. …", 0.5.10 on with
# "#new_tokens_gained: G[, #mamba_num_gained: M]" (scheduler.py, update_running_batch).
_RETRACT = re.compile(r"#retracted_reqs: (?P<n>\d+)(?:, #new_tokens_gained: (?P<gained>-?\d+))?"
                      r"(?:, #mamba_num_gained: (?P<mamba>-?\d+))?"
                      r"(?:, #new_token_ratio: [\d.]+ -> (?P<ratio>[\d.]+))?")

BATCH_LABELS: dict[str, str] = {  # label as SGLang prints it → record key
    "#running-req": "running_req", "#queue-req": "queue_req", "token usage": "token_usage",
    "full token usage": "full_token_usage", "swa token usage": "swa_token_usage",
    "mamba usage": "mamba_usage", "mamba num": "mamba_num", "#token": "num_tokens",
    "#full token": "full_num_tokens", "#swa token": "swa_num_tokens",
    "gen throughput (token/s)": "gen_throughput", "cache hit rate": "cache_hit_rate",
    "#retracted-req": "retracted_req", "cpu graph": "graph",
    "input throughput (token/s)": "input_throughput", "#new-seq": "new_seq",
    "#new-token": "new_token", "#cached-token": "cached_token", "accept len": "accept_len",
    "accept rate": "accept_rate", "cuda graph": "graph", "npu graph": "graph",
    "#pending-token": "pending_token",
}
STARTUP_KEYS = ("max_total_num_tokens", "max_running_requests", "context_len")
_INT_KEYS = {"running_req", "queue_req", "mamba_num", "num_tokens", "full_num_tokens",
             "swa_num_tokens", "retracted_req",
             "new_seq", "new_token", "cached_token", "pending_token", "max_total_num_tokens",
             "max_running_requests", "max_mamba_cache_size", "context_len"}

Record = dict[str, Any]


def new_record(kind: str) -> Record:
    record: Record = dict.fromkeys(RECORD_KEYS)
    record["kind"] = kind
    return record


def _number(key: str, raw: str) -> Any:
    text = raw.strip().rstrip(",").strip()
    if key == "graph":
        return {"true": True, "false": False}.get(text.lower())
    try:
        if key == "cache_hit_rate" and text.endswith("%"):  # a fraction, as /metrics has it
            return float(text[:-1]) / 100
        if key in _INT_KEYS:
            return int(float(text))
        return float(text.rstrip("%"))
    except ValueError:
        return None


def parse_log_line(line: str) -> Record | None:
    """One record for a batch, startup or ready line; None for anything else."""
    text = line.rstrip("\r\n")
    match = _MESSAGE.search(text)
    if not match:
        return None
    record = _message_record(match["msg"])
    if record is None:
        return None
    prefix = text[:match.start()]
    stamp = _STAMP.search(prefix) or _TIME_ONLY.search(prefix)  # a date wins over a time
    record["timestamp"] = stamp["ts"] if stamp else None
    record["rank"] = " ".join(_RANK_TAG.findall(prefix)) or None
    return record


def _message_record(msg: str) -> Record | None:
    if msg.startswith(("Decode out of memory", "KV cache pool is full")):
        return _retract_record(msg)
    batch = _BATCH.match(msg)
    if batch:
        record = new_record("decode" if batch["kind"] == "Decode" else "prefill")
        for part in filter(None, [batch["mixed"], *batch["rest"].split(", ")]):
            pair = _KV_PAIR.match(part)
            if not pair:
                continue
            key = BATCH_LABELS.get(pair["key"].strip())
            if key is not None:
                record[key] = _number(key, pair["value"])
        return record
    record = new_record("startup")
    if msg.startswith("max_total_num_tokens="):
        for pair in _EQ_PAIR.finditer(msg):
            if pair["key"] in STARTUP_KEYS:
                record[pair["key"]] = _number(pair["key"], pair["value"])
    elif msg.startswith("Mamba Cache is allocated"):
        size = _MAMBA_SIZE.search(msg)
        record["max_mamba_cache_size"] = int(size[1]) if size else None
    elif msg.startswith("KV Cache is allocated"):
        tokens = _KV_TOKENS.search(msg)
        record["max_total_num_tokens"] = int(tokens[1]) if tokens else None
    elif msg.startswith("max_running_requests is capped"):
        capped = _CAPPED.search(msg)  # SGLang ≥ 0.5.17 says why the cap is what it is
        if capped is None:
            return None
        record["max_running_requests"] = int(capped["cap"])
        record["max_mamba_cache_size"] = int(capped["slots"])
        record["mamba_slots_per_request"] = int(capped["per"])
    else:
        return new_record("ready")
    return record


def _retract_record(msg: str) -> Record | None:
    found = _RETRACT.search(msg)
    if found is None:
        return None
    record = new_record("retract")
    record["retracted_req"] = int(found["n"])
    record["new_tokens_gained"] = int(found["gained"]) if found["gained"] else None
    record["mamba_num_gained"] = int(found["mamba"]) if found["mamba"] else None
    record["new_token_ratio"] = float(found["ratio"]) if found["ratio"] else None
    return record


def parse_log(text: str) -> list[Record]:
    records = []
    for line in text.splitlines():
        try:
            record = parse_log_line(line)
        except (ValueError, TypeError, IndexError):
            continue
        if record is not None:
            records.append(record)
    return records


def server_info_record(body: dict[str, Any]) -> Record:
    info = parse_server_info(body)
    record = new_record("server_info")
    record.update(max_total_num_tokens=info.max_total_num_tokens,
                  max_running_requests=info.max_running_requests,
                  max_mamba_cache_size=info.max_mamba_cache_size,
                  context_len=info.context_len, version=info.version,
                  gen_throughput=info.last_gen_throughput)
    return record


_METRIC_KEYS = {
    "sglang:num_running_reqs": "running_req", "sglang:num_queue_reqs": "queue_req",
    "sglang:token_usage": "token_usage", "sglang:full_token_usage": "full_token_usage",
    "sglang:swa_token_usage": "swa_token_usage", "sglang:mamba_usage": "mamba_usage",
    "sglang:mamba_used_tokens": "mamba_num", "sglang:num_used_tokens": "num_tokens",
    "sglang:gen_throughput": "gen_throughput", "sglang:spec_accept_length": "accept_len",
    "sglang:spec_accept_rate": "accept_rate", "sglang:max_total_num_tokens":
    "max_total_num_tokens", "sglang:context_len": "context_len",
    "sglang:is_cuda_graph": "graph", "sglang:num_retracted_reqs": "retracted_req",
    "sglang:num_paused_reqs": "paused_req", "sglang:cache_hit_rate": "cache_hit_rate",
}
_RANK_LABELS = ("dp_rank", "tp_rank", "pp_rank")


def parse_metrics(text: str) -> list[Record]:
    """One `metrics` record per rank label set found in Prometheus text."""
    by_rank: dict[str | None, Record] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError, KeyError):
        return []
    for family in families:
        for sample in family.samples:
            key = _METRIC_KEYS.get(sample.name)
            if key is None:
                continue
            labels = sample.labels
            parts = [f"{k.split('_')[0].upper()}{labels[k]}" for k in _RANK_LABELS
                     if k in labels]
            rank = " ".join(parts) or None
            record = by_rank.setdefault(rank, new_record("metrics"))
            record["rank"] = rank
            value = sample.value
            if key == "graph":
                record[key] = bool(value)
            elif key in _INT_KEYS:
                record[key] = int(value)
            else:
                record[key] = float(value)
    return list(by_rank.values())


def detect_kind(text: str) -> str:
    """'server_info', 'metrics' or 'log' for the content of a file."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return "server_info"
    head = stripped[:4000]
    if "# TYPE sglang:" in head or "# HELP sglang:" in head or re.search(
            r"^sglang:[a-z_]+[{ ]", head, re.MULTILINE):
        return "metrics"
    return "log"


def parse_any(text: str) -> tuple[str, list[Record]]:
    """Detect what the text holds and parse it."""
    kind = detect_kind(text)
    if kind == "server_info":
        try:
            body = json.loads(text)
        except json.JSONDecodeError:
            return kind, []
        return kind, [server_info_record(body)] if isinstance(body, dict) else []
    if kind == "metrics":
        return kind, parse_metrics(text)
    return kind, parse_log(text)
