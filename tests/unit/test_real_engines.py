"""Real SGLang 0.5.17 through the engine classes (#28), checked from the data the H200 runs
left (bench/real_sglang/data/2026-12-03-h200-s15): after the refactor every start, health
wait, capacity read, metrics sample, request, rolling restart and stop of a real server goes
through tasks/engines/ (RealSGLang), and every output row through infra/output_row.py.

- Three tiny Qwen3-Next servers sharing the GPU (job_tiny_canary.toml) ran 12,000, 40,000 and
  70,000 prompts. The two shorter jobs made no move: the restart's payback (its measured
  start-up against the work left) asked more than the 1.41× the model promised. The 70,000
  job ran a canary: server-2 restarted onto max_running_requests 120 (RealSGLang.stop_one,
  launch_specs, start_one, wait_healthy, capacity), measured 0.95× against its control
  group, and was restarted back — every prompt once, no error. (Session 5 saw the same move
  measure 0.96×: the job pins `--cuda-graph-max-bs 32`, and the canary's batches above 32
  ran eager, which the step-time model does not score; the policy now lifts the graphs with
  the cap.)
- The outputs run (n = 2, a JSON schema on every other row, integer ids, a `topic` column):
  the shards' schema is exactly the declared one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl

from infra.output_row import GENERATED
from infra.settings import load_settings
from infra.sglang.flags import ServerFlags
from infra.sglang.hardware import Hardware
from infra.sglang.planner import Demand
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.versions import parse_version
from infra.sim.predict import Workload
from tasks.tuning.diagnosis import Diagnosis
from tasks.tuning.policy import Search, gain_to_pay_for_restart, propose, restart_cost

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "bench" / "real_sglang" / "data" / "2026-12-03-h200-s15"
TINY = ROOT / "tests" / "fixtures" / "models" / "tiny-qwen3-next"
JOB = ROOT / "bench" / "real_sglang" / "job_tiny_canary.toml"


def log(name: str) -> str:
    return (DATA / name).read_text()


def summary_field(text: str, pattern: str) -> str:
    match = re.search(pattern, text)
    assert match is not None, pattern
    return match.group(1)


def test_every_prompt_once_in_each_real_run() -> None:
    for name, prompts in (("canary-12000-no-trigger.log", 12_000),
                          ("canary-40000-no-trigger.log", 40_000),
                          ("canary-rollback-mrr32to120.log", 70_000)):
        text = log(name)
        assert f"prompts: {prompts:,} done this run (0 errors, 0 committed before)" in text
        assert "stopped 3 servers (SIGKILLed: none, ports still busy: none)" in text


def test_the_canary_restarted_one_real_server_there_and_back() -> None:
    text = log("canary-rollback-mrr32to120.log")
    there = re.search(r"server-2 restarted as canary \(\w+\): healthy after (\d+) s, cap (\d+)",
                      text)
    back = re.search(r"server-2 restarted as rollback \(\w+\): healthy after (\d+) s, cap (\d+)",
                     text)
    assert there is not None and back is not None
    assert (int(there.group(2)), int(back.group(2))) == (120, 32)  # each server's own answer
    assert ("canary rolled_back: canary 7,616 vs control 8,015 tok/s per server (0.95× "
            "measured, 1.41× predicted), 2 server restarts") in text


def test_todays_policy_proposes_the_move_the_run_tried_with_graphs_to_its_cap() -> None:
    settings = load_settings(str(JOB))
    hw = Hardware(model_profile(str(TINY), 0.04), gpu_profile("h200"), parse_version("0.5.17"))
    proposal = propose(Diagnosis("request-capped", "", 8000.0), settings.server, None,
                       Search(hw, demand=Demand(2048, Workload(45, 130)), pinned=True))
    assert proposal is not None and proposal.flags.max_running_requests == 120
    # (the run's log said 1.41x; the replay's steady window then counted a wave too many)
    assert proposal.predicted_gain is not None and proposal.predicted_gain > 1.05
    # What the run tried kept `--cuda-graph-max-bs 32`: its batches above 32 ran eager, and
    # it measured 0.95×. Today's policy lifts the graphs with the cap (policy.graphs_for_cap).
    # (session 5's ledger has the flags; today's log the same move, no graphs lifted)
    session5 = DATA.parent / "2026-12-01-h200-s5" / "rollback" / "tuning.jsonl"
    tried = ServerFlags.model_validate(json.loads(session5.read_text().splitlines()[1])["flags"])
    assert tried.max_running_requests == 120 and tried.graph_max_bs == 32
    assert ("max_running_requests 32→120 (what the pools hold) (pools kept) — predicted"
            in log("canary-rollback-mrr32to120.log"))
    assert proposal.flags.graph_max_bs == 120
    assert "CUDA graphs up to 120 (were 32" in proposal.reason


def test_the_payback_explains_which_jobs_moved() -> None:
    """At each job's start (its measured start-up, the rate the watch read), what a restart
    had to promise: the 12,000 and 40,000-prompt jobs more than 1.41×, the 70,000 less."""
    settings = load_settings(str(JOB))
    tuning = settings.tuning
    rate = float(summary_field(log("canary-40000-no-trigger.log"),
                               r"request-capped at ([\d,]+) tok/s").replace(",", ""))
    needed = {}
    for name, prompts in (("canary-12000-no-trigger.log", 12_000),
                          ("canary-40000-no-trigger.log", 40_000),
                          ("canary-rollback-mrr32to120.log", 70_000)):
        startup = float(summary_field(log(name), r"3 servers healthy after ([\d.]+) s"))
        cost = restart_cost(startup, tuning.drain_timeout_s, settings.stop_grace_s, 128, 32,
                            rate)
        needed[prompts] = gain_to_pay_for_restart(prompts, 128, rate, 3, cost,
                                                  tuning.min_predicted_gain,
                                                  tuning.restart_payback)
    assert needed[12_000] > needed[40_000] > 1.41 > needed[70_000]


def test_real_answers_fill_the_declared_output_row() -> None:
    rows = pl.read_parquet(DATA / "outputs" / "rows.parquet")
    check = json.loads((DATA / "outputs" / "outputs-check.json").read_text())
    assert rows.height == check["rows"] == 800 and check["joined"] == 800
    assert rows.schema["id"] == pl.Int64 and rows.schema["topic"] == pl.String  # as given
    for column in GENERATED:
        if column.always:
            assert rows.schema[column.name] == column.dtype, column.name
    assert rows.select("id", "sample_index").n_unique() == 800
    assert check["schema_valid"] + check["schema_invalid"] == 400
