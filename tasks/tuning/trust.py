"""How far the tuner trusts its step model for a move, from what the running fleet measured.

The model is calibrated on the families run on the device; on one it has never met it can be
far off, and more so the larger the batch (the MoE hybrids' rates ran 20-70 % high at caps
96-312 before their fit). A gain is a ratio of two predictions, so an error that is the same
at every batch cancels; one that grows with the batch does not, and the fleet has only shown
the model the batches it ran. So before it proposes, the tuner compares the rate the fleet
measured with the model's figure for the configuration it runs (`model_error`), and a move
whose cap takes the batch past what the fleet has run (`EXPLORATION_REACH` × the running
requests seen) is exploration: its predicted rate is discounted by the model's measured
optimism (never raised by its pessimism), and the label says so. The canary then measures it
before any rollout, as for every move of a fleet with a canary.
"""

from __future__ import annotations

from dataclasses import dataclass

EXPLORATION_REACH = 1.25  # a cap this far past the largest batch seen is a batch never seen


@dataclass(frozen=True)
class ModelTrust:
    """What the fleet has shown the model: the largest mean running batch of a server, and
    measured ÷ predicted for the configuration it runs (None: nothing measured yet)."""

    observed_running: float
    model_error: float | None

    def explores(self, cap: int) -> bool:
        return cap > EXPLORATION_REACH * max(self.observed_running, 1.0)

    @property
    def discount(self) -> float:
        """Factor on an exploring move's predicted rate: the model's measured optimism (a
        model that read 2× the fleet's rate halves it), 1.0 where it read low or nothing."""
        if self.model_error is None:
            return 1.0
        return min(1.0, self.model_error)

    def label(self, cap: int) -> str:
        return (f"exploration: cap {cap} takes batches past the {self.observed_running:.0f} "
                f"running seen; rate discounted ×{self.discount:.2f} for the model's measured "
                f"error ({self.model_error or 1.0:.2f}× its figure)")


def measured_trust(running: list[float], measured_tok_s: float,
                   predicted_tok_s: float) -> ModelTrust:
    error = measured_tok_s / predicted_tok_s if measured_tok_s > 0 and predicted_tok_s > 0 else None
    return ModelTrust(max(running, default=0.0), error)
