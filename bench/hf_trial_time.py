"""What a trial of a GPT-2-small-sized model (124M parameters) costs on this machine.

    python -m bench.hf_trial_time [--steps 3] [--batch 8] [--block 128] [--device auto]

Times the steps a trial is made of, on a GPT-2 of GPT-2 small's sizes (12 layers, 12 heads,
d_model 768, 50,257 tokens) built from a config (no download): a gated training step (what gate
methods do while pruning), a plain training step (fine-tuning) and a scoring forward, each the
median of ``--steps`` after one warm-up. The trial of ``studies/own_model.toml`` (50 gate steps,
100 fine-tuning steps, 16,384 tokens scored, batch 8 x 128) is extrapolated from them. On a GPU
(``--device auto`` picks one where there is one) the steps run as the trainer runs them:
training under bf16 autocast, scoring in fp32, each step timed until the GPU has finished it.
"""

from __future__ import annotations

import argparse

import torch

from bench.common import print_json, print_table
from trainers.hf import HFLanguageModel
from trainers.training import autocast, median_seconds, pick_device, weight_groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--device", default="auto", help="auto (a GPU where there is one), cpu or cuda")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = pick_device(args.device)
    model = HFLanguageModel.from_architecture(
        "gpt2", vocab_size=50257, n_layer=12, n_head=12, d_model=768, block_size=args.block
    ).to(device)
    params = model.count_parameters()[0]
    x = torch.randint(0, 50257, (args.batch, args.block), device=device)
    opt = torch.optim.AdamW(weight_groups(model, 0.01), lr=1e-4)
    gates = [torch.ones(12, requires_grad=True, device=device) for _ in range(12)]

    def train_step(head_gates=None) -> None:
        with autocast(device):
            loss = model.loss(x, x, head_gates)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def score() -> None:
        with torch.no_grad():
            model(x)

    model.train()
    gated = median_seconds(lambda: train_step(gates), args.steps, device)
    plain = median_seconds(train_step, args.steps, device)
    model.eval()
    forward = median_seconds(score, args.steps, device)
    tokens = args.batch * args.block
    trial = 50 * gated + 100 * plain + (16384 / tokens) * forward
    rows = [
        ["gated training step", f"{gated * 1000:.0f} ms", f"{tokens / gated:,.0f}"],
        ["training step", f"{plain * 1000:.0f} ms", f"{tokens / plain:,.0f}"],
        ["scoring forward", f"{forward * 1000:.0f} ms", f"{tokens / forward:,.0f}"],
        ["own_model.toml trial (50 + 100 steps, 16k tokens scored)", f"{trial:.0f} s", ""],
    ]
    title = f"GPT-2 small sizes ({params / 1e6:.0f}M parameters), batch {args.batch} x {args.block}"
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    title = f"{title}, {where}, torch threads {torch.get_num_threads()}"
    print_table(title, ["what", "time", "tokens/s"], rows)
    print_json(
        "hf_trial_time",
        {
            "device": where,
            "params": params,
            "gated_step_s": gated,
            "step_s": plain,
            "forward_s": forward,
            "trial_s": trial,
        },
    )


if __name__ == "__main__":
    main()
