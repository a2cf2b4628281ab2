"""Theorem 1 by search: the global minimizer of the population loss over static slot distributions.

(1) Every one-hot assignment ``p^K_h = e_a, p^V_h = e_b`` (up to relabelling heads) is scored exactly;
(2) projected gradient descent on the product of simplices refines from the best ones and random
interior points. The claim holds when every assignment within ``tol`` of the best has ``p^K_h = e_{r_h}``,
``p^V_h = e_{r_h+1}`` with distinct ``r_h`` in 0..S-2, and no refined point beats it by more than ``tol``."""

from __future__ import annotations

import itertools
from typing import Iterable, Optional

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from phaseinterp.errors import UserInputError
from phaseinterp._checks import check_int, check_seed, check_real
from phaseinterp.theory.model import IdealizedInductionModel, Population, single_threaded
from phaseinterp.theory.results import SearchGrid, SearchResult


def project_to_simplex(v: Float[Tensor, "*lead slot"]) -> Float[Tensor, "*lead slot"]:
    """Euclidean projection of each row onto the probability simplex (Held, Wolfe & Crowder 1974)."""
    u, _ = v.sort(dim=-1, descending=True)
    css = u.cumsum(-1) - 1
    k = torch.arange(1, v.shape[-1] + 1, device=v.device, dtype=v.dtype)
    support = (u - css / k) > 0
    rho = support.to(v.dtype).cumsum(-1).argmax(-1, keepdim=True)  # last index where support holds
    theta = css.gather(-1, rho) / (rho + 1).to(v.dtype)
    return (v - theta).clamp_min(0)


def is_claimed_form(key_slots, value_slots, S: int) -> bool:
    """``p^K_h = e_{r_h}``, ``p^V_h = e_{r_h+1}`` with distinct r_h in 0..S-2."""
    key_slots, value_slots = list(key_slots), list(value_slots)
    return (all(0 <= a <= S - 2 and b == a + 1 for a, b in zip(key_slots, value_slots))
            and len(set(key_slots)) == len(key_slots))


def _batched_loss(model: IdealizedInductionModel, p_key, p_value, population: Population, chunk: int = 256):
    out = []
    for i in range(0, p_key.shape[0], chunk):
        out.append(model.loss(model.static_gates(p_key[i : i + chunk]), model.static_gates(p_value[i : i + chunk]),
                              population))
    return torch.cat(out)


def one_hot_losses(model: IdealizedInductionModel, population: Population) -> pd.DataFrame:
    """Exact loss of every one-hot assignment, one row per multiset of (key slot, value slot) pairs."""
    S, m = model.S, model.heads
    pairs = list(itertools.product(range(S), range(S)))
    configs = list(itertools.combinations_with_replacement(range(len(pairs)), m))
    eye = torch.eye(S, dtype=torch.float64, device=model.device)
    key_slots = torch.tensor([[pairs[i][0] for i in c] for c in configs])
    value_slots = torch.tensor([[pairs[i][1] for i in c] for c in configs])
    with torch.no_grad():
        losses = _batched_loss(model, eye[key_slots], eye[value_slots], population)
    return pd.DataFrame(dict(
        key_slots=[tuple(r.tolist()) for r in key_slots], value_slots=[tuple(r.tolist()) for r in value_slots],
        loss=losses.cpu().numpy(),
        claimed_form=[is_claimed_form(a.tolist(), b.tolist(), S) for a, b in zip(key_slots, value_slots)],
    )).sort_values("loss", kind="stable").reset_index(drop=True)


def refine(model: IdealizedInductionModel, p_key: Float[Tensor, "start head slot"],
           p_value: Float[Tensor, "start head slot"], population: Population, *, steps: int = 300,
           step_size: float = 1.0) -> tuple[Tensor, Tensor, Tensor]:
    """Projected gradient descent with per-start Armijo backtracking from every start at once;
    returns the refined ``(p_key, p_value, loss)``."""
    step_size = check_real("step_size", step_size, 0.0, low_open=True)
    steps = check_int("steps", steps, 0, why=" (0: only the loss of every start)")
    x = torch.stack([p_key, p_value], dim=1).clone()  # [start, branch, head, slot]
    lr = torch.full((x.shape[0],), step_size, dtype=x.dtype, device=x.device)

    def f(z):
        return _batched_loss(model, z[:, 0], z[:, 1], population, chunk=z.shape[0])

    for _ in range(steps):
        z = x.detach().requires_grad_(True)
        fx = f(z)
        (g,) = torch.autograd.grad(fx.sum(), z)
        fx = fx.detach()
        accepted = torch.zeros_like(lr, dtype=torch.bool)
        new = x.clone()
        for _ in range(30):  # backtracking: halve the step of every start not yet accepted
            trial = project_to_simplex(x - lr[:, None, None, None] * g)
            with torch.no_grad():
                ft = f(trial)
            decrease = (g * (x - trial)).sum(dim=(1, 2, 3))
            ok = (ft <= fx - 1e-4 * decrease) & ~accepted
            new[ok] = trial[ok]
            accepted |= ok
            if accepted.all():
                break
            lr = torch.where(accepted, lr, lr / 2)
        moved = (new - x).abs().amax(dim=(1, 2, 3))
        x = new
        lr = torch.where(accepted, (lr * 2).clamp_max(1e3), lr)
        if (moved < 1e-13).all():
            break
    with torch.no_grad():
        final = f(x)
    return x[:, 0], x[:, 1], final


def global_search(model: IdealizedInductionModel, *, n_random: int = 16, n_refine_best: int = 4, steps: int = 300,
                  seed: int = 0, tol: float = 1e-9, population: Optional[Population] = None) -> SearchResult:
    """Theorem-1 search for one model: one-hot enumeration plus local refinement (module docstring).

    The population is exact: the eps = 0 symmetry, else the enumeration when it has at most
    ``model.max_exact`` sequences; else a seeded Monte Carlo sample, whose loss differences
    below its standard error are noise (the result says which it used).
    """
    n_random = check_int("n_random", n_random, 0)
    n_refine_best = check_int("n_refine_best", n_refine_best, 0)
    steps = check_int("steps", steps, 1)
    seed = check_seed("seed", seed)
    tol = check_real("tol", tol, 0.0)
    with single_threaded():
        return _global_search(model, n_random, n_refine_best, steps, seed, tol, population)


def _global_search(model, n_random, n_refine_best, steps, seed, tol, population) -> SearchResult:
    if population is None:
        population = model.population(symmetric=model.eps == 0, seed=seed)
    table = one_hot_losses(model, population)
    eye = torch.eye(model.S, dtype=torch.float64, device=model.device)
    starts_key, starts_value, kinds = [], [], []
    for row in table.head(n_refine_best).itertuples():
        starts_key.append(eye[list(row.key_slots)])
        starts_value.append(eye[list(row.value_slots)])
        kinds.append("one_hot")
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n_random):
        # Uniform on the simplex (Dirichlet(1)): normalised exponential draws.
        exponential = -torch.rand(2, model.heads, model.S, generator=gen, dtype=torch.float64).log()
        start = (exponential / exponential.sum(-1, keepdim=True)).to(model.device)
        starts_key.append(start[0])
        starts_value.append(start[1])
        kinds.append("random")
    refined_rows, refined_key, refined_value = [], np.zeros((0,)), np.zeros((0,))
    if starts_key:
        pk, pv, loss = refine(model, torch.stack(starts_key), torch.stack(starts_value), population, steps=steps)
        refined_key, refined_value = pk.cpu().numpy(), pv.cpu().numpy()
        for i, kind in enumerate(kinds):
            refined_rows.append(dict(start=kind, loss=float(loss[i]), max_p_key=float(pk[i].amax(-1).min()),
                                     max_p_value=float(pv[i].amax(-1).min()),
                                     key_slots=tuple(pk[i].argmax(-1).tolist()),
                                     value_slots=tuple(pv[i].argmax(-1).tolist())))
    return SearchResult(config=model.config(), population=population.kind, n_sequences=len(population),
                        tol=tol, one_hot=table, refined=pd.DataFrame(refined_rows),
                        refined_p_key=refined_key, refined_p_value=refined_value)


def search_grid(grid: Iterable[tuple[int, int, int]], *, L: int = 2, eps: float = 0.0, kappa: float = 0.1,
                gamma: float = 2.0, beta: float = 4.0, **search_kwargs) -> SearchGrid:
    """`global_search` at every ``(N, S, m)`` of ``grid`` (other model arguments shared)."""
    results = [global_search(IdealizedInductionModel(N, S, L, heads=m, eps=eps, kappa=kappa, gamma=gamma, beta=beta),
                             **search_kwargs) for N, S, m in grid]
    if not results:
        raise UserInputError("grid is empty; give at least one (N, S, m)")
    return SearchGrid(results=results)
