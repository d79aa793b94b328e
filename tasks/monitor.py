"""Sample every server's /metrics every few seconds into a time series kept with the run.

Throughput is measured from the finished-token counter's deltas (SGLang's
`sglang:generation_tokens_total`; each engine names its counters: SGLangMetrics below),
converted to modeled GPU time with the time scale (1 for real SGLang), so targets in tok/s
per GPU mean the same thing on the simulator and on hardware.
"""

from __future__ import annotations

import io
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import polars as pl
from prometheus_client.parser import text_string_to_metric_families

from infra.files import atomic_write
from infra.sglang.client import get_metrics_text
from infra.sglang.observe import parse_metrics
from tasks.feed import FeedProbe, FeedSample


@dataclass(frozen=True)
class Sample:
    t: float  # wall seconds since the monitor started
    epoch: int  # which fleet configuration (restart cycle) this belongs to
    server: str
    alive: bool
    running: int | None
    queued: int | None
    kv_usage: float | None
    mamba_usage: float | None
    gen_throughput: float | None  # the server's own figure (modeled time)
    generation_tokens_total: float | None
    # Requests the scheduler took back (KV or state ran out mid-decode: a cap the pools do not
    # sustain thrashes) and the prefix cache's hit rate; None from older series.
    retracted: float | None = None
    cache_hit_rate: float | None = None
    # Requests finished so far (`sglang:num_requests_total`): how many turned over in a
    # window, which tells a rate from a wave (tasks/tuning/judge.py).
    requests_total: float | None = None
    # Tokens decoded so far, finished or not (`sglang:realtime_tokens_total{mode="decode"}`,
    # updated at each decode log line): a rate that long answers do not turn into waves.
    decode_tokens_total: float | None = None


def _counter(text: str, name: str, mode: str | None = None) -> float | None:
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and (mode is None or sample.labels.get("mode") == mode):
                    return float(sample.value)
    except (ValueError, TypeError, IndexError, KeyError):
        return None
    return None


class SGLangMetrics:
    """What the monitor reads from a server's /metrics, by the names SGLang gives it: the
    gauges (running, queued, pool usage, retractions, cache hits: infra/sglang/observe.py)
    and three counters. An engine whose server names them otherwise brings its own reader
    (tasks/engines/base.py: `Engine.metrics`)."""

    finished_tokens = "sglang:generation_tokens_total"  # tokens of finished requests
    finished_requests = "sglang:num_requests_total"
    decoded_tokens = "sglang:realtime_tokens_total"  # {mode="decode"}: finished or not

    def read(self, text: str, server: str, t: float, epoch: int) -> Sample:
        records = parse_metrics(text)
        rec = records[0] if records else {}
        kv = rec.get("full_token_usage")
        if kv is None:
            kv = rec.get("token_usage")
        return Sample(t, epoch, server, True, rec.get("running_req"), rec.get("queue_req"), kv,
                      rec.get("mamba_usage"), rec.get("gen_throughput"),
                      _counter(text, self.finished_tokens), rec.get("retracted_req"),
                      rec.get("cache_hit_rate"), _counter(text, self.finished_requests),
                      _counter(text, self.decoded_tokens, mode="decode"))


class MetricsReader(Protocol):
    def read(self, text: str, server: str, t: float, epoch: int) -> Sample: ...


def sample_server(name: str, url: str, api_key: str | None, t: float, epoch: int,
                  metrics: MetricsReader) -> Sample:
    text = get_metrics_text(url, api_key, timeout_s=3.0)
    if text is None:
        return Sample(t, epoch, name, False, None, None, None, None, None, None)
    return metrics.read(text, name, t, epoch)


class FleetMonitor:
    """A background thread that samples the fleet; `samples` grows for the whole run, and
    `feed` with it: this process's CPU starvation at each tick (tasks/feed.py), which tells a
    window about the servers from one about the client machine."""

    def __init__(self, interval_s: float, api_key: str | None,
                 metrics: MetricsReader) -> None:
        self.interval_s = interval_s
        self.api_key = api_key
        self.metrics = metrics  # the engine's (tasks/engines: SGLang's names)
        self.samples: list[Sample] = []
        self.feed: list[FeedSample] = []
        self._probe = FeedProbe()
        self._servers: dict[str, str] = {}
        self._epoch = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="fleet-monitor", daemon=True)

    def now(self) -> float:
        return time.monotonic() - self._t0

    def watch(self, servers: dict[str, str], epoch: int) -> None:
        """Sample these servers (name → url) from now on, as part of `epoch`."""
        with self._lock:
            self._servers = dict(servers)
            self._epoch = epoch

    def start(self) -> FleetMonitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def sample_now(self) -> list[Sample]:
        with self._lock:
            servers, epoch = dict(self._servers), self._epoch
        t = self.now()
        fresh = [sample_server(n, u, self.api_key, t, epoch, self.metrics)
                 for n, u in servers.items()]
        with self._lock:
            self.samples.extend(fresh)
            self.feed.append(self._probe.read(t))
        return fresh

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample_now()

    def snapshot(self) -> list[Sample]:
        with self._lock:
            return list(self.samples)

    def feed_snapshot(self) -> list[FeedSample]:
        with self._lock:
            return list(self.feed)

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [asdict(s) for s in self.snapshot()]
        schema = {"t": pl.Float64, "epoch": pl.Int64, "server": pl.String, "alive": pl.Boolean,
                  "running": pl.Int64, "queued": pl.Int64, "kv_usage": pl.Float64,
                  "mamba_usage": pl.Float64, "gen_throughput": pl.Float64,
                  "generation_tokens_total": pl.Float64, "retracted": pl.Float64,
                  "cache_hit_rate": pl.Float64, "requests_total": pl.Float64,
                  "decode_tokens_total": pl.Float64}
        buf = io.BytesIO()  # polars reports a full disk as ComputeError: write it ourselves
        pl.DataFrame(rows, schema=schema).write_parquet(buf)
        atomic_write(path, buf.getvalue())
        return path
