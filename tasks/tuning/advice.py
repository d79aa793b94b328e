"""The tuner's advice for servers this job does not own (engine=external).

Someone else starts and stops those servers (a Kubernetes deployment, a Slurm job), so the
tuner cannot run a canary or restart anything: it does everything up to the move — measure,
diagnose, score every configuration for the job's own workload — and writes the move down
instead: the SGLang flags to relaunch with, the client concurrency, the predicted rate and
gain, and why. It lands in the run's summary (`advice`), its log, and a `tuning-advice`
artifact in the Prefect UI. One piece of advice per run: the watch stops proposing after it
(the fleet does not change under it, so the next one would say the same).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect.artifacts import create_markdown_artifact

from tasks.engines import Engine
from tasks.tuning.diagnosis import Diagnosis
from tasks.tuning.policy import Proposal
from tasks.tuning.state import TunerState
from tasks.tuning.watch import RegressionWatch


def launch_flags(engine: Engine, proposal: Proposal) -> str:
    """The server flags of the proposed configuration, as one would paste them after
    `python -m sglang.launch_server --model-path M --host H --port P`."""
    return " ".join(engine.server_flags(proposal.flags))


def advice_record(engine: Engine, diag: Diagnosis, proposal: Proposal) -> dict[str, Any]:
    return {
        "diagnosis": diag.kind, "evidence": diag.evidence,
        "measured_tok_s_per_gpu": round(diag.tok_s_per_gpu, 1),
        "predicted_tok_s_per_gpu": (round(proposal.predicted_tok_s_per_gpu, 1)
                                    if proposal.predicted_tok_s_per_gpu is not None else None),
        "predicted_gain": (round(proposal.predicted_gain, 3)
                           if proposal.predicted_gain is not None else None),
        "launch_flags": launch_flags(engine, proposal),
        "client_concurrency_per_server": proposal.concurrency,
        "flags": proposal.flags.model_dump(exclude_none=True, exclude={"extra_args"}),
        "reason": proposal.reason,
    }


def advice_handler(state: TunerState,
                   watch: RegressionWatch) -> Callable[[Diagnosis, Proposal], bool]:
    """The watch's `on_proposal` for servers the job does not own: write the move down."""

    def handle(diag: Diagnosis, proposal: Proposal) -> bool:
        record = advice_record(state.engine, diag, proposal)
        state.advised(record)
        state.logger.warning("advice (engine=external: these servers are not restarted by "
                             "this job): relaunch them with %s — %s", record["launch_flags"],
                             proposal.reason)
        create_markdown_artifact(advice_markdown(record), key="tuning-advice",
                                 description="what to relaunch the external servers with")
        watch.enabled = False
        return True

    return handle


def advice_markdown(record: dict[str, Any]) -> str:
    gain = record["predicted_gain"]
    return "\n".join([
        "# Tuning advice for the external servers",
        "",
        f"**Seen:** {record['diagnosis']}: {record['evidence']}",
        "",
        f"**Relaunch each server with:** `{record['launch_flags']}`",
        "",
        f"**Predicted:** {record['predicted_tok_s_per_gpu'] or 0:,.0f} tok/s per GPU"
        + (f" ({gain:.2f}× the model's figure for the current flags)" if gain else ""),
        "",
        f"Why: {record['reason']}",
    ])
