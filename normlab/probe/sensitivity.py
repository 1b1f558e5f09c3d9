"""Output sensitivity: to a random weight perturbation (Admin, C8) and to training (DeepNet, C7).

The output `f(x)` is the final stream the head reads (tap `final.out`, `[B, T, d]`), so every
placement is compared on the same, normalized scale.

Perturbation sensitivity (Liu et al. 2020, "Understanding the Difficulty of Training
Transformers", arXiv 2004.08249): every weight matrix inside the blocks (`p.dim() >= 2`: Q/K/V,
attention output, both MLP maps) gets `delta = eps * rms(p) * z`, z ~ N(0, 1) elementwise; then

    perturb_change      E ||f(x; w + delta) - f(x; w)||^2, mean over tokens, draws and batches
    perturb_relative    the same divided by E ||f(x; w)||^2

The perturbed weights go through `torch.func.functional_call`; the model's own tensors are never
written.

Update size (Wang et al. 2022, "DeepNet", arXiv 2203.00555, Fig. 3): a deep copy of the model is
trained for `steps` AdamW steps (linear warmup over `warmup` steps, then constant `lr`) on the
training batches, and after every step

    update_size[k]      mean over tokens of ||f(x; theta_k) - f(x; theta_0)|| on a fixed batch
    update_loss[k]      the training loss at step k (before the step)
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn
from torch.func import functional_call

from normlab.probe.hooks import eval_mode, hooked
from normlab.probe.measures import model_loss, token_norms

Batch = tuple[torch.Tensor, torch.Tensor]


def perturbed_weights(model: nn.Module) -> list[str]:
    """Names of the parameters the perturbation touches: the blocks' weight matrices."""
    return [n for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() >= 2]


@torch.no_grad()
def perturbation_sensitivity(model: nn.Module, batches: Sequence[Batch], *, eps: float = 0.01,
                             draws: int = 2, seed: int = 0) -> dict[str, object]:
    """Mean squared change of the output under `draws` random perturbations (module doc)."""
    names = perturbed_weights(model)
    params = dict(model.named_parameters())
    gen = torch.Generator(device="cpu").manual_seed(seed)
    change, base_sq = [], []
    seen: dict[int, torch.Tensor] = {}
    with eval_mode(model):
        for d in range(draws):
            new = {}
            for n in names:
                p = params[n]
                z = torch.randn(p.shape, generator=gen, dtype=p.dtype).to(p.device)
                new[n] = p + eps * p.float().square().mean().sqrt().to(p.dtype) * z
            for idx, _ in batches:
                f0 = model.stream(idx)
                with hooked(model, {"final.out": lambda _m, _i, x: seen.__setitem__(0, x)}):
                    functional_call(model, new, (idx,), strict=False, tie_weights=True)
                f1 = seen.pop(0)
                change.append(token_norms(f1 - f0).square().mean().item())
                if d == 0:
                    base_sq.append(token_norms(f0).square().mean().item())
            del new
    c = torch.tensor(change, dtype=torch.float64)
    ref = sum(base_sq) / len(base_sq)
    return {"perturb_change": c.mean().item(),
            "perturb_change_std": c.std().item() if len(change) > 1 else 0.0,
            "perturb_relative": c.mean().item() / ref if ref > 0 else float("nan"),
            "perturb_eps": eps, "perturb_draws": draws}


def update_size(model: nn.Module, train_batches: Sequence[Batch], eval_batch: Batch, *,
                steps: int = 30, lr: float = 1e-3, warmup: int = 0,
                betas: tuple[float, float] = (0.9, 0.98), weight_decay: float = 0.0,
                grad_clip: float | None = None, seed: int = 0) -> dict[str, object]:
    """Train a copy of `model` for `steps` steps and record how far its output moves (module doc).
    Batch k of training is `train_batches[k % len(train_batches)]`."""
    from normlab.config import TrainConfig
    from normlab.train.optim import adamw

    if steps < 1:
        raise ValueError("update_size: steps must be >= 1")
    work = copy.deepcopy(model)
    for p in work.parameters():
        p.requires_grad_(True)
    opt = adamw(work, TrainConfig(lr=lr, beta1=betas[0], beta2=betas[1],
                                  weight_decay=weight_decay))
    idx_eval = eval_batch[0]
    kind = model.cfg.kind
    sizes, losses = [0.0], []
    device = next(work.parameters()).device  # its dropout draws from that device's generator
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        with torch.no_grad(), eval_mode(work):
            f0 = work.stream(idx_eval)
        work.train()
        for k in range(steps):
            for group in opt.param_groups:
                group["lr"] = lr * min(1.0, (k + 1) / warmup) if warmup else lr
            idx, targets = train_batches[k % len(train_batches)]
            loss = model_loss(kind, work(idx).logits, targets)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(work.parameters(), grad_clip)
            opt.step()
            losses.append(loss.item())
            with torch.no_grad(), eval_mode(work):
                sizes.append(token_norms(work.stream(idx_eval) - f0).mean().item())
    del work, opt
    return {"update_size": sizes, "update_loss": losses, "update_lr": lr,
            "update_warmup": warmup, "update_steps": steps}
