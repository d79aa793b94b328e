"""Run a fixed workload through the simulator's scheduler in modeled time, with no HTTP.

What the simulated server would do for `requests` requests of fixed prompt and output length,
sent by a client that keeps `in_flight` outstanding (the pipeline keeps the cap plus its
queue target). Used to hold the simulator to real end-to-end runs (tests/unit/
test_real_sglang_e2e.py) and to sweep configurations without waiting on wall clocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.sglang.flags import ServerFlags
from infra.sglang.hardware import Hardware
from infra.sglang.memory import plan_memory
from infra.sglang.profiles import GpuProfile, ModelProfile
from infra.sglang.roofline import StepCalibration, build_roofline
from infra.sglang.versions import SGLangVersion
from infra.sim.scheduler import SchedulerOptions, SimRequest, SimScheduler, no_log

# Fast enough that a replay of thousands of requests takes a fraction of a second.
REPLAY_TIME_SCALE = 1e7


@dataclass(frozen=True)
class ReplayResult:
    cap: int
    tok_s: float  # output tokens per modeled second, first request sent to last finished
    busy_tok_s: float  # from the first completion to the last send: a full queue throughout
    seconds: float


def _replay(scheduler: SimScheduler, requests: int, in_flight: int, prompt_tokens: int,
            output_tokens: int) -> tuple[float, float, float]:
    """(modeled seconds in all, the busy window's seconds, its tokens): `in_flight` clients
    send `requests` alike rows, each its next as soon as an answer comes."""
    marks: list[tuple[float, int]] = []  # at each send: (modeled clock, tokens done)

    def send(_req: SimRequest | None = None, _clock: float = 0.0) -> None:
        if len(marks) < requests:
            marks.append((scheduler._modeled_clock, scheduler.stats.generation_tokens_total))
            scheduler.enqueue(prompt_tokens, output_tokens, on_done=send)

    for _ in range(min(in_flight, requests)):
        send()
    scheduler.run_until_idle()
    (t0, n0), (t1, n1) = marks[min(in_flight, requests - 1)], marks[requests - 1]
    return scheduler._modeled_clock, t1 - t0, n1 - n0


def replay_scheduler(model: ModelProfile, gpu: GpuProfile, flags: ServerFlags,
                     version: SGLangVersion, exact: bool = False,
                     calibration: StepCalibration | None = None) -> SimScheduler:
    """The simulated server's scheduler for these flags in modeled time, with no log: from
    event to event (a completion, the KV pool's edge; the steps between summed in closed
    form), or with `exact` one decode step at a time — the oracle the events are held to
    (tests/unit/test_event_replay.py). `calibration` replaces the measured step constants
    (what a fit tries: bench/real_sglang/fit_h100.py)."""
    plan = plan_memory(model, gpu, flags, version)
    prefix_state = version.locks_prefix_state and not flags.disable_radix_cache
    roofline = build_roofline(model, gpu, flags, plan, calibration=calibration)
    return SimScheduler(plan, roofline, REPLAY_TIME_SCALE,
                        no_log,
                        SchedulerOptions(prefix_state=prefix_state,
                                         max_chunk_steps=1 if exact else None))


def replay(hw: Hardware, flags: ServerFlags, requests: int, prompt_tokens: int,
           output_tokens: int, queue_target: int = 4) -> ReplayResult:
    """The simulator's figures for this workload under these flags."""
    scheduler = replay_scheduler(hw.model, hw.gpu, flags, hw.version)
    plan = scheduler.plan
    total_s, busy_s, busy_tokens = _replay(
        scheduler, requests, plan.max_running_requests + queue_target, prompt_tokens,
        output_tokens)
    tokens = requests * output_tokens
    return ReplayResult(cap=plan.max_running_requests, tok_s=tokens / total_s,
                        busy_tok_s=busy_tokens / busy_s if busy_s > 0 else 0.0,
                        seconds=total_s)


@dataclass(frozen=True)
class ClosedLoopResult:
    """What a closed loop over a request list got from the simulated server."""

    cap: int
    max_total_num_tokens: int
    answered: int
    committed_tokens: int  # output tokens of the answered requests
    seconds: float  # modeled: the first send to the last answer (or the deadline)
    retracted: int
    steady_tok_s: float  # answered between the first full round and the last send

    @property
    def committed_tok_s(self) -> float:
        return self.committed_tokens / self.seconds if self.seconds > 0 else 0.0


def _closed_loop(scheduler: SimScheduler, reqs: list[tuple[int, int]], concurrency: int,
                 max_s: float) -> tuple[list[tuple[float, int]], float]:
    """(modeled answer time, output tokens) of each answer in time, and the last send:
    `concurrency` clients, each sending its next row when its answer comes (none after
    `max_s`)."""
    pending = list(reversed(reqs))
    answers: list[tuple[float, int]] = []
    last_send = 0.0

    def send() -> None:
        nonlocal last_send
        prompt, out = pending.pop()
        last_send = scheduler._modeled_clock
        scheduler.enqueue(prompt, out, on_done=answered)

    def answered(req: SimRequest, clock: float) -> None:
        if clock <= max_s:
            answers.append((clock, req.target_tokens))
        if pending and clock < max_s:
            send()

    for _ in range(min(concurrency, len(pending))):
        send()
    scheduler.run_until_idle()  # what was sent before max_s still finishes, as served
    return answers, last_send


def _steady_rate(answers: list[tuple[float, int]], concurrency: int, last_send: float) -> float:
    """Tokens per second answered while every client had a request out: from the answer
    that ends the first round to the last send (0 when the list is too short for one)."""
    if len(answers) <= concurrency:
        return 0.0
    start = answers[concurrency - 1][0]
    window = last_send - start
    # answers at the window's start are the round that opened it (a wave of equal lengths
    # ends together: counting those after the opening one counted a wave too many)
    tokens = sum(out for t, out in answers[concurrency:] if start < t <= last_send)
    return tokens / window if window > 0 else 0.0


def replay_requests(model: ModelProfile, gpu: GpuProfile, flags: ServerFlags,
                    version: SGLangVersion, reqs: list[tuple[int, int]], concurrency: int,
                    max_s: float = float("inf")) -> ClosedLoopResult:
    """A closed loop of `concurrency` clients over (prompt tokens, output tokens) rows, as
    bench/real_sglang/probe_long.py drives real SGLang: every row's output runs to its
    length (ignore_eos), a row answered after `max_s` modeled seconds does not count. From
    event to event; `replay_requests_exact` steps every decode step (the oracle)."""
    return closed_loop(replay_scheduler(model, gpu, flags, version), reqs, concurrency, max_s)


def replay_requests_exact(model: ModelProfile, gpu: GpuProfile, flags: ServerFlags,
                          version: SGLangVersion, reqs: list[tuple[int, int]],
                          concurrency: int) -> ClosedLoopResult:
    return closed_loop(replay_scheduler(model, gpu, flags, version, exact=True), reqs,
                       concurrency, float("inf"))


def closed_loop(scheduler: SimScheduler, reqs: list[tuple[int, int]], concurrency: int,
                max_s: float) -> ClosedLoopResult:
    plan = scheduler.plan
    answers, last_send = _closed_loop(scheduler, reqs, concurrency, max_s)
    done_all = len(answers) == len(reqs)
    return ClosedLoopResult(cap=plan.max_running_requests,
                            max_total_num_tokens=plan.max_total_num_tokens,
                            answered=len(answers), committed_tokens=sum(o for _, o in answers),
                            seconds=answers[-1][0] if done_all and answers else max_s,
                            retracted=scheduler.stats.retracted_total,
                            steady_tok_s=_steady_rate(answers, concurrency, last_send))
