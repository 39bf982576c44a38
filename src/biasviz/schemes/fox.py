"""FoX: the Forgetting Transformer's forget gates as an additive bias (Lin et al., ICLR 2025).

b_h(i, j) = sum_{k=j+1..i} log sigmoid(w_h . x_k + beta_h) = c_i - c_j with c_t the cumulative sum of the
log forget gates, as the authors' ``ForgettingAttentionLayer`` computes it (``log_fgate = logsigmoid(
fgate_proj(x))``, then the difference of its cumulative sums). Since -softplus(z) = log sigmoid(-z), this
is CABLE's family with the gate's sign flipped.

Options (the authors' ``fgate_type``):
- ``gate="full"`` (default): w_h and beta_h learned, the bias depends on the input;
- ``gate="bias_only"``: beta_h alone, learned; context-free, an ALiBi with slope -log sigmoid(beta_h);
- ``gate="fixed"``: beta_h fixed at the decay-time initialisation, which needs ``decay_time_min`` and
  ``decay_time_max``: decay times T_h spaced log-uniformly between them, beta_h = -log(expm1(1 / T_h)),
  so that T_h = -1 / log sigmoid(beta_h). ``bias_only`` starts there too when both are given, else at 0.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from biasviz.common.errors import BiasvizError
from biasviz.schemes import register
from biasviz.schemes.base import PositionScheme, ScoreTerms, option_number, relative_distance

GATES = ("full", "bias_only", "fixed")


def decay_time_bias(n_head: int, decay_time_min: float, decay_time_max: float) -> list[float]:
    """beta_h with decay times T_h = -1 / log sigmoid(beta_h) log-spaced from ``decay_time_min`` to ``_max``.

    >>> [round(-1 / math.log(1 / (1 + math.exp(-b))), 6) for b in decay_time_bias(3, 2.0, 8.0)]
    [2.0, 4.0, 8.0]
    """
    if not (decay_time_min > 0 and decay_time_max > 0):
        raise BiasvizError("FoX decay_time_min and decay_time_max must be positive")
    lo, hi = math.log(decay_time_min), math.log(decay_time_max)
    times = [math.exp(lo + (hi - lo) * h / max(n_head - 1, 1)) for h in range(n_head)]
    return [-math.log(math.expm1(1.0 / t)) for t in times]


@register
class FoX(PositionScheme):
    """Cumulative log forget gates: each token k between j and i multiplies the weight by sigmoid(gate_k)."""

    name = "fox"

    def __init__(self, n_head: int, d_model: int, **options: Any) -> None:
        super().__init__(n_head, d_model, **options)
        self.gate = str(self.options["gate"])
        times = (self.options["decay_time_min"], self.options["decay_time_max"])
        self.decay_init = None if None in times else decay_time_bias(n_head, float(times[0]), float(times[1]))
        if self.gate == "full":
            self.proj = nn.Linear(d_model, n_head)  # w_h, beta_h
        elif self.gate == "bias_only":
            self.gate_bias = nn.Parameter(torch.zeros(n_head))
        else:
            self.register_buffer("gate_bias", torch.tensor(self.decay_init, dtype=torch.float32))

    @classmethod
    def _check(cls, options: dict[str, Any], n_head: int) -> None:
        gate = options["gate"]
        if gate not in GATES:
            raise BiasvizError(f"unknown FoX gate '{gate}'; use one of {', '.join(GATES)}")
        times = [options[k] for k in ("decay_time_min", "decay_time_max")]
        for key in ("decay_time_min", "decay_time_max"):
            if options[key] is not None:
                option_number("fox", key, options[key], positive=True)
        if gate == "fixed" and None in times:
            raise BiasvizError("FoX gate 'fixed' needs decay_time_min and decay_time_max (the decay-time init)")

    @property
    def depends_on_input(self) -> bool:
        return self.gate == "full"

    def reset_parameters(self) -> None:
        if self.gate == "full":
            nn.init.normal_(self.proj.weight, std=0.02)
            nn.init.zeros_(self.proj.bias)
        elif self.decay_init is not None:
            with torch.no_grad():
                self.gate_bias.copy_(torch.tensor(self.decay_init))
        else:
            nn.init.zeros_(self.gate_bias)

    def distance_bias(self, d: torch.Tensor) -> torch.Tensor | None:
        if self.gate == "full":
            return None
        log_gate = F.logsigmoid(self.gate_bias.float())  # (H,): -m_h * (i - j) with m_h = -log sigmoid(beta_h)
        return log_gate.view(-1, *(1,) * d.dim()) * d.float()  # (H, *d.shape)

    def bias(self, x: torch.Tensor | None, q_len: int, k_len: int) -> torch.Tensor:
        if self.gate != "full":  # one log gate per head
            return self.distance_bias(relative_distance(q_len, k_len, self.gate_bias.device))[None]  # (1, H, Tq, Tk)
        c = self.cumulative_gate(x)  # (B, H, Tk)
        c_q = c[:, :, k_len - q_len :]  # (B, H, Tq)
        return c_q[:, :, :, None] - c[:, :, None, :]  # (B, H, Tq, Tk)

    def cumulative_gate(self, x: torch.Tensor | None) -> torch.Tensor:
        """c_t, the cumulative sum of the log forget gates up to t: (B, H, T), in float32."""
        if x is None:
            raise BiasvizError("the FoX bias with gate 'full' depends on the input: it needs the attention input x")
        return torch.cumsum(F.logsigmoid(self.proj(x).float()), dim=1).transpose(1, 2)  # (B, H, T)

    def score_terms(self, x: torch.Tensor | None) -> ScoreTerms | None:
        """With the full gate, c_i - c_j from one cumulative sum per forward; else the distance table."""
        return super().score_terms(x) if self.gate != "full" else ScoreTerms(ends=self.cumulative_gate(x))
