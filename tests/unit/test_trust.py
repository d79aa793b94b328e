"""Learn before trusting (tasks/tuning/trust.py): a move into batches the fleet never ran is
exploration, and the model's measured optimism discounts it — a deliberately wrong prior
(the fleet measuring half the model's figure) stops the tuner's big-cap move."""

from __future__ import annotations

from pathlib import Path

from infra.sglang.flags import ServerFlags
from infra.sglang.hardware import Hardware
from infra.sglang.planner import Demand
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.versions import parse_version
from infra.sim.predict import Workload
from tasks.tuning.diagnosis import Diagnosis, ServerWindow
from tasks.tuning.policy import Proposal, Search, propose
from tasks.tuning.trust import ModelTrust, measured_trust

Q35 = Path(__file__).resolve().parents[2] / "bench" / "real_sglang" / "models" / (
    "qwen3.6-35b-a3b-text")
HW = Hardware(model_profile(str(Q35), 64.63), gpu_profile("h200"), parse_version("0.5.17"))
DEMAND = Demand(2048, Workload(1024, 256))
# The 35B as the device runs it: random weights, so an MTP draft is never accepted and the
# moves in play are the pools' (roofline._prior_accept_len)
START = ServerFlags(extra_args=("--load-format", "dummy"))


def proposal_at(model_error: float) -> tuple[Proposal | None, float]:
    baseline = DEMAND.tok_s_per_gpu(HW.model, HW.gpu, START, HW.memory_plan(START), HW.version)
    measured = baseline * model_error
    diag = Diagnosis("mamba-bound", "", measured,
                     [ServerWindow("server-0", True, 158.0, 4.0, 0.1, 0.95, measured)])
    return propose(diag, START, None, Search(HW, demand=DEMAND, min_gain=1.05)), baseline


def test_a_move_past_the_batches_seen_is_flagged_exploration() -> None:
    proposal, _ = proposal_at(1.0)
    assert proposal is not None and proposal.flags.graph_max_bs is not None
    cap = HW.memory_plan(proposal.flags).max_running_requests
    assert cap > 1.25 * 158 and "exploration: cap" in proposal.reason
    assert "discounted ×1.00" in proposal.reason


def test_a_model_the_fleet_measured_at_half_its_figure_does_not_get_its_big_move() -> None:
    trusted, _ = proposal_at(1.0)
    doubted, _ = proposal_at(0.5)
    assert trusted is not None and trusted.predicted_gain is not None
    trusted_cap = HW.memory_plan(trusted.flags).max_running_requests
    if doubted is not None:  # what is left is a move within the batches seen
        assert "exploration" not in doubted.reason
        assert HW.memory_plan(doubted.flags).max_running_requests <= 1.25 * 158
        assert doubted.predicted_gain is not None
        assert doubted.predicted_gain < trusted.predicted_gain
    assert trusted_cap > 1.25 * 158


def test_the_discount_is_the_measured_optimism_never_a_bonus() -> None:
    assert measured_trust([100.0, 120.0], 500.0, 1000.0) == ModelTrust(120.0, 0.5)
    assert ModelTrust(120.0, 0.5).discount == 0.5
    assert ModelTrust(120.0, 1.4).discount == 1.0
    assert ModelTrust(120.0, None).discount == 1.0
    assert not ModelTrust(120.0, 0.5).explores(150) and ModelTrust(120.0, 0.5).explores(151)
