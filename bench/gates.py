"""Training step time with head gates against the same model without them.

    python -m bench.gates

A gated step samples hard-concrete gates, multiplies each head's output by its gate and adds the
Lagrangian term; the plain step is the same model and batch. Target (issue 7): at most 5% slower.
"""

from __future__ import annotations

import torch

from bench.common import median_seconds, print_json, print_table
from trainers.gates import HardConcreteGates, Lagrangian
from trainers.model import LanguageModel, ModelConfig


def step_times(family: str) -> tuple[float, float]:
    """Median seconds of a plain and of a gated training step, measured in interleaved rounds."""
    model = LanguageModel(ModelConfig(vocab_size=66, family=family))
    gates = HardConcreteGates(list(model.cfg.layer_heads))
    lagrangian = Lagrangian()
    opt = torch.optim.AdamW([*model.parameters(), *gates.parameters(), *lagrangian.parameters()], lr=1e-4)
    x = torch.randint(0, 66, (32, 128))

    def plain_step() -> None:
        loss = model.loss(x, x)
        opt.zero_grad()
        loss.backward()
        opt.step()

    def gated_step() -> None:
        loss = model.loss(x, x, gates.split(gates())) + lagrangian(gates.expected_sparsity(), 0.5)
        opt.zero_grad()
        loss.backward()
        opt.step()

    plain, gated = [], []
    for _ in range(5):  # interleaved rounds: both see the same machine noise
        plain.append(median_seconds(plain_step, 6, warmup=1))
        gated.append(median_seconds(gated_step, 6, warmup=1))
    return sorted(plain)[2], sorted(gated)[2]


def main() -> None:
    torch.manual_seed(0)
    rows, results = [], []
    for family in ("gpt", "all_attention"):
        p, g = step_times(family)
        results.append({"family": family, "plain_s": p, "gated_s": g, "ratio": g / p})
        rows.append(
            [
                family,
                f"{p * 1000:.1f}",
                f"{g * 1000:.1f}",
                f"{g / p:.3f}",
                "met" if g / p <= 1.05 else "not met",
            ]
        )
    print_table(
        f"training step, batch 32 x 128, torch threads {torch.get_num_threads()}",
        ["family", "plain ms", "gated ms", "gated / plain", "target <= 1.05"],
        rows,
    )
    print_json("gates", {"threads": torch.get_num_threads(), "results": results})


if __name__ == "__main__":
    main()
