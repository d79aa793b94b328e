"""The simulator's /metrics: the families SGLang 0.5.17 emits that users and the pipeline read.

Names, HELP texts, label sets and histogram buckets are copied from a real 0.5.17 scrape on
the H200 (tests/fixtures/sglang-0.5.17/*.metrics-*.txt). Written by hand rather than with
prometheus_client, whose counters add `*_created` series that real SGLang does not emit.
Latencies are in modeled GPU seconds, like the simulator's throughput figures.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0,
                100.0, 200.0, 400.0)
E2E_BUCKETS = (*TTFT_BUCKETS, 600.0, 1200.0, 1800.0, 2400.0)
QUEUE_BUCKETS = (0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0,
                 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 200.0, 300.0,
                 400.0, 500.0, 600.0, 700.0, 800.0, 900.0, 1000.0, 1200.0, 1400.0, 1600.0,
                 1800.0, 2000.0, 2500.0, 3000.0)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06,
               0.08, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)


@dataclass
class Histogram:
    """Cumulative buckets as Prometheus counts them (le = upper bound, inclusive)."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.total += value * times
        self.count += times


@dataclass
class RequestLatencies:
    """What the scheduler records for each finished request."""

    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(QUEUE_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))

    def record(self, queued_s: float, ttft_s: float, e2e_s: float, tokens: int) -> None:
        self.queue.observe(queued_s)
        self.ttft.observe(ttft_s)
        self.e2e.observe(e2e_s)
        if tokens > 1:
            self.itl.observe((e2e_s - ttft_s) / (tokens - 1), tokens - 1)


def _labels(pairs: dict[str, str]) -> str:
    body = ",".join(f'{k}="{v}"' for k, v in sorted(pairs.items()))
    return "{" + body + "}"


def _num(value: float) -> str:
    return repr(float(value))


class Exposition:
    """Prometheus text format, family by family (HELP, TYPE, samples)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.lines: list[str] = []

    def scheduler(self, **extra: str) -> dict[str, str]:
        return {"engine_type": "unified", "model_name": self.model, "moe_ep_rank": "0",
                "pp_rank": "0", "tp_rank": "0", **extra}

    def tokenizer(self) -> dict[str, str]:
        return {"engine_type": "unified", "is_streaming": "false", "model_name": self.model}

    def family(self, name: str, kind: str, doc: str,
               samples: Iterable[tuple[str, dict[str, str], float]]) -> None:
        self.lines += [f"# HELP sglang:{name} {doc}", f"# TYPE sglang:{name} {kind}"]
        self.lines += [f"sglang:{name}{suffix}{_labels(lab)} {_num(v)}"
                       for suffix, lab, v in samples]

    def gauge(self, name: str, doc: str, value: float, **extra: str) -> None:
        self.family(name, "gauge", doc, [("", self.scheduler(**extra), value)])

    def counter(self, name: str, doc: str, value: float) -> None:
        # As 0.5.17 writes them: HELP and TYPE name the series, `_total` included.
        self.family(f"{name}_total", "counter", doc, [("", self.tokenizer(), value)])

    def histogram(self, name: str, doc: str, hist: Histogram, labels: dict[str, str]) -> None:
        samples = [("_sum", labels, hist.total)]
        running = 0
        for bound, n in zip((*hist.bounds, float("inf")), hist.counts, strict=True):
            running += n
            le = "+Inf" if bound == float("inf") else repr(float(bound))
            samples.append(("_bucket", {**labels, "le": le}, running))
        samples.append(("_count", labels, hist.count))
        self.family(name, "histogram", doc, samples)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO


@dataclass
class EngineStats:
    """What /metrics and the log lines report (the scheduler keeps them, a scrape reads them)."""

    running: int = 0
    queued: int = 0
    kv_used_tokens: int = 0
    mamba_used: int = 0
    gen_throughput: float = 0.0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0  # counted when a request finishes, as SGLang counts it
    requests_total: int = 0
    decode_steps: int = 0
    # tokens decoded, finished or not, as of the last decode log line: SGLang's
    # realtime_tokens_total{mode="decode"}, progress that long answers do not hide in waves
    decode_tokens_total: int = 0
    prefill_tokens_total: int = 0  # realtime_tokens_total{mode="prefill_compute"}
    retracted_last: int = 0  # retracted at the last retraction (SGLang's gauge)
    retracted_total: int = 0
    cached_tokens_total: int = 0
    cache_hit_rate: float = 0.0  # over the recent prefill batches
    new_token_ratio: float = INIT_NEW_TOKEN_RATIO


@dataclass
class Snapshot:
    """One scrape: the scheduler's counters beside what its plan fixes."""

    stats: EngineStats
    max_total_num_tokens: int
    context_len: int
    mamba_slots: int
    hybrid: bool  # mamba gauges are written only for a hybrid model
    spec_accept_length: float  # 0.0 without speculative decoding, as SGLang reports it
    startup_phases: dict[str, float]


def render(model: str, snap: Snapshot, lat: RequestLatencies, pid: int) -> str:
    """One scrape of /metrics."""
    out = Exposition(model)
    st = snap.stats
    mamba_used = st.mamba_used if snap.hybrid else None
    kv = st.kv_used_tokens / max(snap.max_total_num_tokens, 1)
    mamba = None if mamba_used is None else mamba_used / max(snap.mamba_slots, 1)
    out.gauge("num_running_reqs", "The number of running requests.", st.running)
    out.gauge("num_queue_reqs", "The number of requests in the waiting queue.", st.queued)
    out.gauge("num_retracted_reqs", "The number of retracted requests.", st.retracted_last,
              pid=str(pid))
    out.gauge("new_token_ratio", "The new token ratio.", round(st.new_token_ratio, 4))
    out.gauge("num_paused_reqs", "The number of paused requests by async weight sync.", 0,
              pid=str(pid))
    out.gauge("gen_throughput", "The generation throughput (token/s).", st.gen_throughput)
    out.gauge("token_usage", "The token usage.", round(max(kv, mamba or 0.0), 2))
    out.gauge("full_token_usage", "The token usage for full attention layers.", round(kv, 2))
    out.gauge("num_used_tokens", "The number of used tokens.", st.kv_used_tokens)
    out.gauge("kv_used_tokens", "Number of actively used token slots in the KV cache pool.",
              st.kv_used_tokens)
    out.gauge("kv_available_tokens", "Number of free token slots in the KV cache pool.",
              snap.max_total_num_tokens - st.kv_used_tokens)
    out.gauge("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.",
              snap.max_total_num_tokens)
    out.gauge("context_len", "Maximum context length.", snap.context_len)
    out.gauge("cache_hit_rate", "The prefix cache hit rate.", round(st.cache_hit_rate, 4))
    out.gauge("spec_accept_length", "Mean acceptance length of speculative decoding "
              "(accepted drafts + bonus token per forward).", snap.spec_accept_length)
    out.gauge("utilization", "The utilization.", 0.0)  # 0.5.17 never sets it (no SLO cap)
    if mamba_used is not None and mamba is not None:
        out.gauge("mamba_usage", "The token usage for Mamba layers.", round(mamba, 2))
        out.gauge("mamba_used_tokens",
                  "Number of actively used state slots in the mamba SSM pool.", mamba_used)
        out.gauge("mamba_available_tokens",
                  "Number of free state slots in the mamba SSM pool (hybrid-SSM only).",
                  snap.mamba_slots - mamba_used)
    out.family("startup_time_seconds", "gauge", "Engine startup duration by phase in seconds.",
               [("", {"engine_type": "unified", "model_name": model, "phase": phase}, s)
                for phase, s in snap.startup_phases.items()])
    out.counter("prompt_tokens", "Number of prefill tokens processed.", st.prompt_tokens_total)
    out.counter("generation_tokens", "Number of generation tokens processed.",
                st.generation_tokens_total)
    out.counter("num_requests", "Number of requests processed.", st.requests_total)
    out.family("realtime_tokens_total", "counter", "Total number of tokens processed (updated "
               "on each log interval). mode: prefill_compute, prefill_cache, decode.",
               [("", out.scheduler(mode="prefill_compute"), st.prefill_tokens_total),
                ("", out.scheduler(mode="decode"), st.decode_tokens_total)])
    if st.retracted_total:  # real SGLang's counter appears with the first retraction
        out.counter("num_retracted_requests", "Number of retracted requests.",
                    st.retracted_total)
    out.histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                  lat.ttft, out.tokenizer())
    out.histogram("e2e_request_latency_seconds", "Histogram of End-to-end request latency in "
                  "seconds", lat.e2e, out.tokenizer())
    out.histogram("queue_time_seconds", "Histogram of queueing time in seconds.", lat.queue,
                  out.scheduler())
    out.histogram("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                  lat.itl, {"engine_type": "unified", "model_name": model})
    return out.text()
