"""Peer distillation (methods.md section 7): a loss function for any phase of a trial."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F


class PeerDistillation:
    """A frozen dense teacher; each layer's attention output (after W_O) is pulled toward the
    teacher's, and the logits toward its softened distribution (KL at T = 2, as CoFi)."""

    def __init__(self, teacher, alpha_layer: float, alpha_logit: float, temperature: float = 2.0):
        self.teacher = copy.deepcopy(teacher).eval().requires_grad_(False)
        self.alpha_layer, self.alpha_logit, self.temperature = alpha_layer, alpha_logit, temperature

    def extra(self, x: torch.Tensor, logits: torch.Tensor, attn: list[torch.Tensor]) -> torch.Tensor:
        """The distillation terms alone: zero when the student computes what the teacher does."""
        with torch.no_grad():
            t_logits, t_attn = self.teacher(x, return_attn=True)
        layer = sum(F.mse_loss(s, t) for s, t in zip(attn, t_attn, strict=True))
        T = self.temperature
        kl = F.kl_div(
            F.log_softmax(logits.flatten(0, 1) / T, dim=-1),
            F.log_softmax(t_logits.flatten(0, 1) / T, dim=-1),
            log_target=True,
            reduction="batchmean",
        )
        return self.alpha_layer * layer + self.alpha_logit * T * T * kl

    def __call__(self, model, x: torch.Tensor, y: torch.Tensor, gates=None) -> torch.Tensor:
        logits, attn = model(x, gates, return_attn=True)
        return F.cross_entropy(logits.flatten(0, 1), y.flatten()) + self.extra(x, logits, attn)
