"""The loops every phase shares: optimise on random batches, score the fixed validation slice."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from trainers.data import random_batch, window_bytes
from trainers.tokenizers import Tokenizer, bits_per_byte

# progress(phase, step, total_steps, loss): called every few steps by long loops.
Progress = Callable[[str, int, int, float], None]


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast(device: torch.device):
    """bf16 autocast for training on a GPU that supports it (weights and optimizer stay fp32),
    nothing on CPU: CPU bf16 matmuls are slower than fp32 on most machines. Scoring stays fp32."""
    enabled = device.type == "cuda" and torch.cuda.is_bf16_supported()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)


def cosine_lr(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up to ``peak``, cosine decay to a tenth of it."""
    if step < warmup:
        return peak * (step + 1) / warmup
    k = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, k))))


def plain_loss(model, x: torch.Tensor, y: torch.Tensor, gates=None) -> torch.Tensor:
    """Cross-entropy of the model (its head gates applied): the loss without distillation."""
    return model.loss(x, y, gates)


def weight_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW's parameter groups as nanoGPT has them: matrices (linear weights, embeddings) decay,
    vectors (biases, norms' gains, gates) do not: decaying a gain pulls a layer's scale to zero."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


@dataclass(frozen=True)
class Schedule:
    """How long one run of the training loop is and at which rate: ``lr_at(step)`` (default:
    ``warmup_steps`` of warm-up, then cosine decay over ``steps``), AdamW with ``weight_decay``
    on the weight matrices; ``phase`` names it in progress lines."""

    steps: int
    batch_size: int
    lr: float
    warmup_steps: int = 0
    weight_decay: float = 0.01
    phase: str = "train"
    lr_at: Callable[[int], float] | None = None


@dataclass(frozen=True)
class Learner:
    """What a run minimises and what learns: ``objective(step, x, y)`` (default
    ``loss_fn(model, x, y, None)``, default cross-entropy); the weights (frozen with
    ``train_weights=False``) and ``extra_optimizers`` (a pruning method's gates)."""

    loss_fn: Callable | None = None
    objective: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    train_weights: bool = True
    extra_optimizers: Sequence[torch.optim.Optimizer] = ()


def fit(
    model: torch.nn.Module,
    tokens: torch.Tensor,
    generator: torch.Generator,
    schedule: Schedule,
    learner: Learner = Learner(),
    progress: Progress | None = None,
    after_step: Callable[[int], bool] | None = None,
) -> float:
    """The one training loop: pretraining, gate training and fine-tuning all run here.

    Each step draws a random batch of ``tokens`` (``generator``) and minimises the
    ``learner``'s objective, on the ``schedule``. ``after_step(steps_done)`` runs after every
    step (evaluations, reports to the scheduler) and ends the training early by returning True.
    Returns the last loss."""
    steps, batch_size, lr, phase = schedule.steps, schedule.batch_size, schedule.lr, schedule.phase
    objective, train_weights = learner.objective, learner.train_weights
    device = next(model.parameters()).device
    if objective is None:
        loss_fn = learner.loss_fn or plain_loss
        objective = lambda step, x, y: loss_fn(model, x, y, None)  # noqa: E731
    optimizers = list(learner.extra_optimizers)
    weights_opt = None
    if train_weights:
        model.train()
        weights_opt = torch.optim.AdamW(weight_groups(model, schedule.weight_decay), lr=lr, betas=(0.9, 0.99))
        optimizers.append(weights_opt)
    else:
        model.eval().requires_grad_(False)  # judged as it is: no dropout, no weight gradients
    lr_at = schedule.lr_at or (lambda step: cosine_lr(step, steps, lr, schedule.warmup_steps))
    loss_value = float("nan")
    try:
        for step in range(steps):
            if weights_opt is not None:
                for group in weights_opt.param_groups:
                    group["lr"] = lr_at(step)
            x, y = random_batch(tokens, batch_size, model.cfg.block_size, generator)
            with autocast(device):
                loss = objective(step, x.to(device), y.to(device))
            loss_value = loss.item()
            if loss.requires_grad:  # frozen weights and gates held open: nothing to learn yet
                for opt in optimizers:
                    opt.zero_grad(set_to_none=True)
                loss.backward()
                if weights_opt is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                for opt in optimizers:
                    opt.step()
            if progress and (step % 50 == 0 or step == steps - 1):
                progress(phase, step + 1, steps, loss_value)
            if after_step is not None:
                stop = after_step(step + 1)
                if train_weights:
                    model.train()  # the hook may have evaluated the model
                if stop:
                    break
    finally:
        if not train_weights:
            model.requires_grad_(True)
        model.train()
    return loss_value


@torch.no_grad()
def mean_loss(
    model: torch.nn.Module,
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
        logits, _ = model(x, head_gates)  # fp32 even on a GPU: the objective compares < 1% gaps
        total += torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
        count += y.numel()
    return total / count


def final_scores(
    model: torch.nn.Module, windows: tuple[torch.Tensor, torch.Tensor], tokenizer: Tokenizer
) -> tuple[float, float]:
    """(perplexity per token, bits per byte) on the evaluation slice: what a trial and the dense
    checkpoint record; bits per byte compares across tokenizers."""
    nats = mean_loss(model, windows)
    return math.exp(nats), bits_per_byte(nats, windows[1].numel(), window_bytes(tokenizer, windows))


def median_seconds(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    """The median time of ``repeats`` calls of ``fn`` after one warm-up (allocations, an
    optimizer's state); on a GPU each call is timed until the device has finished it, not only
    queued it."""

    def finish() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    fn()
    times = []
    for _ in range(repeats):
        finish()
        start = time.perf_counter()
        fn()
        finish()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


@torch.no_grad()
def tokens_per_second(model: torch.nn.Module, x: torch.Tensor, repeats: int = 3) -> float:
    """Inference throughput on one batch of windows: the median of a few timed forwards."""
    device = next(model.parameters()).device
    model.eval()
    x = x.to(device)
    return x.numel() / median_seconds(lambda: model(x), repeats, device)
