"""Why is the fleet slow: window statistics of the monitor's samples, and a diagnosis
(mamba-, KV-, client- or compute-bound, unhealthy, asymmetric) with its evidence.

Also the adapters that let `expansion diagnose` reason about a live server or a log:
`pools_from_caps` (which pool binds, from a cap and a slot count) and `samples_from_log`.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field
from typing import Literal

from infra.sglang.flags import ServerFlags
from infra.sglang.memory import MemoryPlan, slot_ratio
from tasks.monitor import Sample

Kind = Literal["mamba-bound", "kv-bound", "request-capped", "client-bound", "compute-bound",
               "admission-bound", "unhealthy", "asymmetric", "idle"]
# A queue this short beside free slots is requests waiting their turn at prefill, not ones the
# slots cannot take (share of the free slots; at least one request)
ADMISSION_QUEUE_SHARE = 0.05


@dataclass(frozen=True)
class ServerWindow:
    server: str
    alive: bool
    running: float
    queued: float
    kv_usage: float | None
    mamba_usage: float | None
    tok_s: float  # modeled GPU-time tokens/s over the window


@dataclass(frozen=True)
class Diagnosis:
    kind: Kind
    evidence: str
    tok_s_per_gpu: float
    servers: list[ServerWindow] = field(default_factory=list)


def _rate(rows: list[Sample], time_scale: float) -> float:
    """A server's output tokens/s (modeled GPU time) over some samples.

    From the decode-token counter where the server has one (`realtime_tokens_total{mode=
    "decode"}`, 0.5.17): tokens as they are generated, so a server whose long answers have
    not finished yet reads its rate, not 0 (a canary restarted onto a larger cap measured
    1.12x where its configuration commits 1.52x more: bench/tuning.py long-mixed). Else from
    the finished-tokens counter, which moves in waves as requests finish. SGLang's
    `gen_throughput` gauge counts decode time only — on the H200 it read 2,406 tok/s while
    committed tokens grew at 1,673 (+44 %) — so it is only the last resort, for a window
    too short for either counter."""
    for name in ("decode_tokens_total", "generation_tokens_total"):
        counters = [(r.t, getattr(r, name)) for r in rows if getattr(r, name) is not None]
        if len(counters) >= MIN_COUNTER_SAMPLES and counters[-1][0] > counters[0][0]:
            tokens = counted_tokens([c for _, c in counters])
            if tokens > 0:
                return tokens / (counters[-1][0] - counters[0][0]) / time_scale
    gauges = [r.gen_throughput for r in rows if r.gen_throughput is not None]
    return statistics.fmean(gauges) if gauges else 0.0


def counted_tokens(counter: list[float]) -> float:
    """Tokens a counter series counted: a drop means the server restarted (a canary, a
    rolling restart) and its counter began again at zero."""
    total = 0.0
    for before, after in itertools.pairwise(counter):
        total += after - before if after >= before else after
    return total


# Samples of the token counter a window needs before its rate stands for the window.
MIN_COUNTER_SAMPLES = 5
MIN_FINISHED_FOR_MEAN = 20  # finished requests before tokens-per-request means anything


def generated_per_finished(samples: list[Sample]) -> float | None:
    """Output tokens generated per request finished, over the whole run: the mean answer
    length, read so that long answers are not missed while they run. The mean of committed
    answers is biased short early in a job (short answers finish first: 550 tokens after the
    first 2,000 steps of a closed loop whose true mean is 2,000, and still 1,600 after 30,000),
    while tokens generated — the in-flight ones' included — over requests finished converges
    from the other side and much sooner (1,290–1,750 over the same steps; renewal-reward:
    exact in steady state). None before MIN_FINISHED_FOR_MEAN requests or without the
    decode-token counter (SGLang < 0.5.17)."""
    by_server: dict[str, list[Sample]] = {}
    for s in samples:
        if s.alive:
            by_server.setdefault(s.server, []).append(s)
    generated = finished = 0.0
    for rows in by_server.values():
        decode = [r.decode_tokens_total for r in rows if r.decode_tokens_total is not None]
        done = [r.requests_total for r in rows if r.requests_total is not None]
        if len(decode) != len(rows) or len(done) != len(rows):
            return None
        generated += counted_tokens([0.0, *decode])
        finished += counted_tokens([0.0, *done])
    if finished < MIN_FINISHED_FOR_MEAN or generated <= 0:
        return None
    return generated / finished


def window_stats(samples: list[Sample], since: float, time_scale: float) -> list[ServerWindow]:
    """Per-server means over samples at t ≥ since."""
    by_server: dict[str, list[Sample]] = {}
    for s in samples:
        if s.t >= since:
            by_server.setdefault(s.server, []).append(s)
    out = []
    for name, rows in sorted(by_server.items()):
        live = [r for r in rows if r.alive]

        def mean(values: list[float | int | None]) -> float | None:
            vals = [float(v) for v in values if v is not None]
            return statistics.fmean(vals) if vals else None

        out.append(ServerWindow(name, rows[-1].alive, mean([r.running for r in live]) or 0.0,
                                mean([r.queued for r in live]) or 0.0,
                                mean([r.kv_usage for r in live]),
                                mean([r.mamba_usage for r in live]), _rate(live, time_scale)))
    return out


def steady_tok_s_per_gpu(samples: list[Sample], since: float, time_scale: float,
                         ) -> float | None:
    """Median over sampling ticks (after `since`, while the fleet was busy) of the mean
    per-server throughput: robust to the job's tail, when the fleet runs out of work."""
    per_tick: dict[float, list[Sample]] = {}
    for s in samples:
        if s.t >= since and s.alive and (s.running or 0) > 0:
            per_tick.setdefault(round(s.t, 1), []).append(s)
    ticks = [statistics.fmean(_rate([r], time_scale) for r in rows)
             for rows in per_tick.values() if rows]
    return statistics.median(ticks) if len(ticks) >= 3 else None


@dataclass(frozen=True)
class PoolView:
    """Which pool sets the running-request cap, and how (from a plan or a live server)."""

    binding_limit: str
    mamba_slots: int | None = None
    slot_ratio: int | None = None
    mamba_strategy: str | None = None

    @classmethod
    def of(cls, plan: MemoryPlan | None) -> PoolView | None:
        if plan is None:
            return None
        return cls(plan.binding_limit, plan.mamba_slots, plan.slot_ratio, plan.mamba_strategy)

    def how(self) -> str:
        if self.mamba_slots and self.slot_ratio:
            return (f"{self.mamba_slots} slots / {self.slot_ratio} per request under "
                    f"{self.mamba_strategy or 'its strategy'}")
        return "cap = mamba slots / slots per request"


SLOW_SHARE = 0.75  # a server below 0.75 × the median server's tok/s makes a fleet asymmetric


def slow_servers(diag: Diagnosis) -> list[tuple[str, float, float]]:
    """(server, its tok/s, the median) for each server an asymmetric diagnosis names."""
    speeds = [w.tok_s for w in diag.servers]
    if len(speeds) < 2:
        return []
    median = statistics.median(speeds)
    held = statistics.median(w.running for w in diag.servers)
    return [(w.server, w.tok_s, median) for w in diag.servers if _slow(w, median, held)]


def _slow(w: ServerWindow, median: float, median_running: float) -> bool:
    """Under SLOW_SHARE × the median tok/s *with work*: requests queued, or at least as many
    running as the median server. A server that runs out of work at the job's end (nothing
    queued, fewer running) is not a slow GPU, and restarting it gains nothing; a slow GPU
    holds its requests longer, so it keeps its running count even when the client refills
    slowly and its queue reads 0 (a starved client, a loaded box)."""
    has_work = w.queued >= 1 or w.running >= median_running
    return median > 0 and w.tok_s < SLOW_SHARE * median and has_work


def diagnose(windows: list[ServerWindow], caps: dict[str, int],
             pools: MemoryPlan | PoolView | None) -> Diagnosis:
    """Why the fleet runs at its speed, from the window and the servers' caps.

    `caps` is each server's max_running_requests; `pools` says which pool sets the cap
    (the memory model's plan, or what a live server's numbers imply)."""
    plan = pools if isinstance(pools, PoolView) or pools is None else PoolView.of(pools)
    if not windows:
        return Diagnosis("idle", "no samples yet", 0.0)
    per_gpu = statistics.fmean(w.tok_s for w in windows)
    dead = [w.server for w in windows if not w.alive]
    if dead:
        return Diagnosis("unhealthy", f"no /metrics answer from {', '.join(dead)}", per_gpu,
                         windows)
    speeds = [w.tok_s for w in windows]
    median = statistics.median(speeds)
    held = statistics.median(w.running for w in windows)
    slow = [w for w in windows if _slow(w, median, held)]
    if len(windows) > 1 and slow:
        names = ", ".join(f"{w.server} {w.tok_s:,.0f} tok/s" for w in slow)
        return Diagnosis("asymmetric", f"{names} vs a median of {median:,.0f} tok/s: a GPU "
                         "unlike the others (check that server's log and nvidia-smi)",
                         per_gpu, windows)
    running = statistics.fmean(w.running for w in windows)
    queued = statistics.fmean(w.queued for w in windows)
    cap = statistics.fmean(caps.values()) if caps else 0.0
    kv = _mean_opt([w.kv_usage for w in windows])
    mamba = _mean_opt([w.mamba_usage for w in windows])
    at_cap = cap > 0 and running >= 0.9 * cap
    usage = (f"running {running:.1f} of cap {cap:.0f}, queue {queued:.1f}, KV "
             f"{_pct(kv)}, mamba {_pct(mamba)}")
    if not at_cap and queued < max(1.0, ADMISSION_QUEUE_SHARE * (cap - running)):
        # LFM2-8B-A1B at cap 4,096 on a simulated H100: 163 running, 11 queued between
        # prefills; read as "at the cap" before, it said more memory would not help
        return Diagnosis("client-bound", f"{usage}: servers have free slots and "
                         f"{'nothing' if queued < 1 else 'only a short prefill queue'} "
                         "queued — raise client concurrency", per_gpu, windows)
    # Requests turn over fast under a small cap, and in waves when answers are alike: the
    # running count dips below the cap between admissions while the queue waits (real
    # SGLang, tiny model, cap 32: 26.6 running with 2.6 queued). A queue beside a batch near
    # the cap says the cap binds as surely as a full batch does.
    pressed = at_cap or (queued >= 1 and running >= 0.75 * cap)
    if pressed and plan is not None and plan.binding_limit == "mamba" and (kv or 0) < 0.5:
        low = ""
        if mamba is not None and mamba < 0.5:
            # SGLang counts live states; the cap reserves ρ slots per request (reference §2.5).
            low = (f"; mamba usage reads {_pct(mamba)} because it counts live states, not the "
                   "slots each request reserves")
        return Diagnosis("mamba-bound", f"{usage}: the cap comes from the mamba pool "
                         f"({plan.how()}) while KV sits mostly empty{low}", per_gpu, windows)
    if pressed and isinstance(pools, MemoryPlan) and pools.binding_limit == "requested":
        room = pools.pools_hold
        if room > 1.2 * cap:
            return Diagnosis("request-capped", f"{usage}: the cap is the requested "
                             f"max_running_requests ({pools.requested_running_requests}); the "
                             f"pools hold {room}", per_gpu, windows)
    if (kv or 0) >= 0.85 or (plan is not None and plan.binding_limit == "kv" and at_cap):
        return Diagnosis("kv-bound", f"{usage}: the KV pool is the limit", per_gpu, windows)
    if not pressed:
        return Diagnosis("admission-bound", f"{usage}: requests wait while slots are free — "
                         "the scheduler admits them no faster (prefill chunks, "
                         "chunked_prefill_size; a memory move will not help)", per_gpu, windows)
    return Diagnosis("compute-bound", f"{usage}: at the cap with pool headroom; more memory "
                     "will not help", per_gpu, windows)


def _mean_opt(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


STRATEGIES = ("no_buffer", "extra_buffer_lazy", "extra_buffer")


def pools_from_caps(max_running: int | None, mamba_slots: int | None,
                    strategy: str | None) -> PoolView | None:
    """The mamba pool binds when a server's cap equals its mamba slots / ρ: what a plan would
    say, read off a live server or a log that does not name its GPU or model."""
    if not max_running or not mamba_slots:
        return None
    # ρ as SGLang computes it; the overlap scheduler's state is not in a cap or a log line.
    strategies = [strategy] if strategy in STRATEGIES else list(STRATEGIES)
    ratios = dict.fromkeys(slot_ratio(s, overlap, ServerFlags()) for s in strategies
                           for overlap in (True, False))
    for rho in ratios:
        if max_running == mamba_slots // rho:
            return PoolView("mamba", mamba_slots, rho, strategy)
    return None


def samples_from_log(records: list[dict[str, object]], server: str) -> list[Sample]:
    """Decode lines of a server log as monitor samples (t in seconds from the first line)."""
    from datetime import datetime

    out: list[Sample] = []
    t0: datetime | None = None
    for r in records:
        if r.get("kind") != "decode" or not r.get("timestamp"):
            continue
        try:
            ts = datetime.fromisoformat(str(r["timestamp"]).replace(",", "."))
        except ValueError:
            continue
        t0 = t0 or ts
        kv = r.get("full_token_usage") if r.get("full_token_usage") is not None else r.get(
            "token_usage")
        out.append(Sample((ts - t0).total_seconds(), 1, server, True,
                          _opt_int(r.get("running_req")), _opt_int(r.get("queue_req")),
                          _opt_float(kv), _opt_float(r.get("mamba_usage")),
                          _opt_float(r.get("gen_throughput")), None))
    return out


def _opt_int(value: object) -> int | None:
    return int(value) if isinstance(value, (int, float)) else None


def _opt_float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


# --- the tuning ledger ----------------------------------------------------------------------


