"""Log-linear compression gates: ``p_h(r) ∝ exp <c_{h,r}, x_r>`` for the token x_r in slot r.

One gate vector per (head, branch K/V, slot); the embeddings stay fixed. The gate reads the
chunk's content, so p differs from chunk to chunk; `slot_statistics` summarises it by its
population mean and its worst chunk.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from phaseinterp._checks import check_seed, check_real
from phaseinterp.theory.model import IdealizedInductionModel, Population


def random_gate_parameters(model: IdealizedInductionModel, rho: float,
                           seed: int) -> Float[Tensor, "head branch slot dim"]:
    """Initial gate vectors: each ``c_{h,b,r}`` uniform on the sphere of radius ``rho`` (seeded)."""
    rho = check_real("rho", rho, 0.0, low_open=True)
    seed = check_seed("seed", seed)
    gen = torch.Generator().manual_seed(seed)
    c = torch.randn(model.heads, 2, model.S, model.dim, generator=gen, dtype=torch.float64)
    c = rho * c / c.norm(dim=-1, keepdim=True)
    return c.to(model.device)


def gate_distributions(model: IdealizedInductionModel, c: Float[Tensor, "head branch slot dim"],
                       population: Population) -> tuple[Float[Tensor, "batch head chunk slot"],
                                                        Float[Tensor, "batch head chunk slot"]]:
    """``p[b, h, j, r] = softmax_r <c_{h,r}, x_{t_{b,j,r}}>`` for keys and values."""
    x = model.embeddings[population.tokens]  # [b, chunk, slot, dim]
    logits = torch.einsum("hkrd,bjrd->bhkjr", c, x)
    p = logits.softmax(dim=-1)
    return p[:, :, 0], p[:, :, 1]


def gate_loss(model: IdealizedInductionModel, c: Float[Tensor, "head branch slot dim"],
              population: Population) -> Float[Tensor, ""]:
    """Population cross-entropy with log-linear gates (differentiable in c)."""
    key, value = gate_distributions(model, c, population)
    return model.loss(key, value, population)


@torch.no_grad()
def slot_statistics(model: IdealizedInductionModel, c: Float[Tensor, "head branch slot dim"], population: Population
                    ) -> tuple[Float[Tensor, "head branch slot"], Float[Tensor, "head branch slot"]]:
    """Per (head, branch, slot): the population mean of p(r) over chunks, and its minimum over
    the chunks of the population (the worst chunk)."""
    key, value = gate_distributions(model, c, population)
    p = torch.stack([key, value], dim=2)  # [b, h, branch, chunk, slot]
    w = population.weight[:, None, None, None, None] / model.L
    mean = (w * p).sum(dim=(0, 3))
    minimum = p.amin(dim=(0, 3))
    return mean, minimum
