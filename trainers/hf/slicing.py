"""Cutting a projection down to some heads' rows or columns, in place: what every
architecture's ``keep_heads`` is made of."""

from __future__ import annotations

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D


def units(heads: list[int], width: int, offset: int = 0) -> torch.Tensor:
    """Indices of the ``width`` consecutive rows (or columns) of each head, after ``offset``."""
    return torch.tensor([offset + h * width + i for h in heads for i in range(width)], dtype=torch.long)


def set_weights(module: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Give a projection new, smaller weights in place (its forward reads only the tensors, and
    the size attributes that describe them are kept true); ``bias`` None leaves the bias as it is."""
    module.weight = nn.Parameter(weight.contiguous(), requires_grad=module.weight.requires_grad)
    if bias is not None:
        module.bias = nn.Parameter(bias.contiguous(), requires_grad=module.bias.requires_grad)
    if isinstance(module, Conv1D):  # weight is (in, out)
        module.nx, module.nf = weight.shape
    elif isinstance(module, nn.Linear):
        module.out_features, module.in_features = weight.shape


def pick(tensor: torch.Tensor | None, dim: int, index: torch.Tensor) -> torch.Tensor | None:
    return None if tensor is None else tensor.index_select(dim, index.to(tensor.device))
