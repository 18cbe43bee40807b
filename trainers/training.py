"""The loops every phase shares: optimise on random batches, score the fixed validation slice."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from trainers.data import random_batch
from trainers.model import LanguageModel

# progress(phase, step, total_steps, loss): called every few steps by long loops.
Progress = Callable[[str, int, int, float], None]


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def cosine_lr(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up to ``peak``, cosine decay to a tenth of it."""
    if step < warmup:
        return peak * (step + 1) / warmup
    k = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, k))))


def fit(
    model: LanguageModel,
    tokens: torch.Tensor,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    generator: torch.Generator,
    warmup_steps: int = 0,
    weight_decay: float = 0.01,
    loss_fn: Callable | None = None,
    progress: Progress | None = None,
    phase: str = "train",
    lr_at: Callable[[int], float] | None = None,
    after_step: Callable[[int], bool] | None = None,
) -> float:
    """Language-model training (``loss_fn(model, x, y, gates)``, default cross-entropy); returns
    the last loss. The learning rate follows ``lr_at(step)`` (default: warm-up and cosine decay
    over ``steps``). ``after_step(steps_done)`` runs after every step (evaluations, reports to the
    scheduler) and ends the training early by returning True."""
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=weight_decay)
    lr_at = lr_at or (lambda step: cosine_lr(step, steps, lr, warmup_steps))
    model.train()
    loss_value = float("nan")
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        x, y = random_batch(tokens, batch_size, model.cfg.block_size, generator)
        x, y = x.to(device), y.to(device)
        loss = loss_fn(model, x, y, None) if loss_fn else model.loss(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_value = loss.item()
        if progress and (step % 50 == 0 or step == steps - 1):
            progress(phase, step + 1, steps, loss_value)
        if after_step is not None:
            stop = after_step(step + 1)
            model.train()  # the hook may have evaluated the model
            if stop:
                break
    return loss_value


@torch.no_grad()
def mean_loss(
    model: LanguageModel,
    windows: tuple[torch.Tensor, torch.Tensor],
    head_gates: list[torch.Tensor] | None = None,
    batch_size: int = 64,
) -> float:
    """Mean next-token cross-entropy over the fixed slice (exp of it is the perplexity)."""
    device = next(model.parameters()).device
    model.eval()
    x_all, y_all = windows
    total, count = 0.0, 0
    for i in range(0, len(x_all), batch_size):
        x, y = x_all[i : i + batch_size].to(device), y_all[i : i + batch_size].to(device)
        logits, _ = model(x, head_gates)
        total += torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
        count += y.numel()
    return total / count


@torch.no_grad()
def tokens_per_second(model: LanguageModel, x: torch.Tensor, repeats: int = 3) -> float:
    """Inference throughput on one batch of windows: the median of a few timed forwards."""
    device = next(model.parameters()).device
    model.eval()
    x = x.to(device)
    model(x)  # warm-up
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        model(x)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return x.numel() / sorted(times)[len(times) // 2]
