"""Gradient flow ``dc/dt = -grad L(c)`` on the log-linear gate vectors, embeddings fixed.

`integrate` is a Dormand-Prince 5(4) integrator with adaptive step control (the method of
``scipy.integrate.solve_ivp(method="RK45")``, written in torch so it runs on any device);
`gradient_flow` runs it from a random init of radius rho and records the slot distributions
at every accepted step; `gradient_descent` is the small-step Euler discretisation
``c_{k+1} = c_k - eta grad L(c_k)`` that the tests match against the flow.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from phaseinterp.errors import UserInputError
from phaseinterp.theory.gates import gate_loss, random_gate_parameters, slot_statistics
from phaseinterp._checks import check_int, check_real
from phaseinterp.theory.model import IdealizedInductionModel, Population, single_threaded
from phaseinterp.theory.results import FlowResult, FlowSweep

# Dormand-Prince 5(4) tableau (Dormand & Prince 1980), as in Hairer, Norsett & Wanner, Table II.5.2.
_A = (
    (),
    (1 / 5,),
    (3 / 40, 9 / 40),
    (44 / 45, -56 / 15, 32 / 9),
    (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
    (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
    (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84),
)
_B5 = (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0.0)
_B4 = (5179 / 57600, 0.0, 7571 / 16695, 393 / 640, -92097 / 339200, 187 / 2100, 1 / 40)


def _check_tolerances(rtol: float, atol: float) -> tuple[float, float]:
    """The step control's tolerances as Python floats: each a finite number >= 0, not both 0 (the error
    is measured in units of ``atol + rtol |y|``); else a `UserInputError` naming the one at fault."""
    rtol = check_real("rtol", rtol, 0.0, why=" (relative tolerance)")
    atol = check_real("atol", atol, 0.0, why=" (absolute tolerance)")
    if rtol == 0 and atol == 0:
        raise UserInputError("rtol=0 and atol=0: at least one tolerance must be > 0 (the error is measured in "
                             "units of atol + rtol |y|)")
    return rtol, atol


def integrate(f: Callable[[Tensor], Tensor], y0: Tensor, t_max: float, *, rtol: float = 1e-6, atol: float = 1e-9,
              first_step: float = 1e-2, max_step: float = math.inf, t_eval: Optional[Sequence[float]] = None,
              callback: Optional[Callable[[float, Tensor], bool]] = None, max_steps: int = 100_000):
    """Integrate the autonomous ODE ``dy/dt = f(y)`` from t = 0 with Dormand-Prince 5(4).

    Step control: accept when the RMS of ``(y5 - y4) / (atol + rtol max(|y|, |y_new|))`` is <= 1,
    next step ``h * clip(0.9 err^(-1/5), 0.2, 5)``. Steps are shortened to land exactly on every
    time in ``t_eval``. ``callback(t, y)`` runs after every accepted step (and at t = 0);
    returning True stops the integration. Returns ``(t, y, n_accepted, n_rejected)``.
    """
    t_max = check_real("t_max", t_max, 0.0)
    rtol, atol = _check_tolerances(rtol, atol)
    first_step = check_real("first_step", first_step, 0.0, low_open=True)
    if max_step != math.inf:
        max_step = check_real("max_step", max_step, 0.0, low_open=True, why=" (or math.inf: no limit)")
    max_steps = check_int("max_steps", max_steps, 1, why=" (accepted steps at most)")
    evals = sorted(float(t) for t in (() if t_eval is None else t_eval))
    t, y, h = 0.0, y0, first_step
    k1 = f(y)
    accepted = rejected = 0
    if callback is not None and callback(t, y):
        return t, y, accepted, rejected
    while t < t_max and accepted < max_steps:
        h = min(h, max_step, t_max - t)
        landing = next((te for te in evals if te > t + 1e-12), None)
        if landing is not None and t + h > landing:
            h = landing - t
        ks = [k1]
        for i in range(1, 7):
            yi = y + h * sum(a * k for a, k in zip(_A[i], ks))
            ks.append(f(yi))
        y5 = y + h * sum(b * k for b, k in zip(_B5, ks))
        y4 = y + h * sum(b * k for b, k in zip(_B4, ks))
        scale = atol + rtol * torch.maximum(y.abs(), y5.abs())
        err = float(((y5 - y4) / scale).pow(2).mean().sqrt())
        if err <= 1.0:
            t, y, k1 = (landing if landing is not None and abs(t + h - landing) < 1e-12 else t + h), y5, ks[6]
            accepted += 1
            if callback is not None and callback(t, y):
                break
        else:
            rejected += 1
        h = h * min(5.0, max(0.2, 0.9 * (err if err > 0 else 1e-10) ** -0.2))
    return t, y, accepted, rejected


def _negative_gradient(model: IdealizedInductionModel, population: Population) -> Callable[[Tensor], Tensor]:
    def f(c: Tensor) -> Tensor:
        with torch.enable_grad():
            c = c.detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(gate_loss(model, c, population), c)
        return -grad

    return f


class _Recorder:
    """Collects loss, slot distributions and the gate norm at each call; stops the flow once
    every head is concentrated past ``stop_at`` on some (r, r+1) in its worst chunk."""

    def __init__(self, model, population, stop_at: Optional[float]):
        self.model, self.population, self.stop_at = model, population, stop_at
        self.t, self.loss, self.mean, self.minimum, self.norm = [], [], [], [], []

    def __call__(self, t: float, c: Tensor) -> bool:
        with torch.no_grad():
            loss = float(gate_loss(self.model, c, self.population))
        mean, minimum = slot_statistics(self.model, c, self.population)
        self.t.append(t)
        self.loss.append(loss)
        self.mean.append(mean.cpu().numpy())
        self.minimum.append(minimum.cpu().numpy())
        self.norm.append(float(c.norm()))
        if self.stop_at is None:
            return False
        key, value = minimum[:, 0], minimum[:, 1]  # [head, slot]
        paired = torch.minimum(key[:, :-1], value[:, 1:])  # p^K(r) and p^V(r+1), worst chunk
        return bool((paired.amax(dim=-1) >= self.stop_at).all())

    def result(self, model, c0, c, method, settings) -> FlowResult:
        return FlowResult(
            config=model.config(), method=method, settings=settings,
            t=np.asarray(self.t), loss=np.asarray(self.loss),
            mean_p=np.stack(self.mean), min_p=np.stack(self.minimum), gate_norm=np.asarray(self.norm),
            initial_gates=c0.cpu().numpy(), final_gates=c.detach().cpu().numpy(),
        )


def _flow_population(model: IdealizedInductionModel, population: Optional[Population], n_samples: int,
                     seed: int) -> Population:
    # Log-linear gates read the chunk's content, so the eps = 0 one-sequence symmetry does not apply.
    return population if population is not None else model.population(n_samples=n_samples, seed=seed)


def gradient_flow(model: IdealizedInductionModel, *, rho: float = 0.01, seed: int = 0, t_max: float = 2000.0,
                  stop_at: Optional[float] = 0.99, rtol: float = 1e-7, atol: float = 1e-10,
                  t_eval: Optional[Sequence[float]] = None, population: Optional[Population] = None,
                  n_samples: int = 2048) -> FlowResult:
    """Gradient flow of the population loss in the log-linear gate vectors from a random init
    of radius ``rho`` (each gate vector on the sphere of that radius, drawn with ``seed``).

    Runs until ``t_max`` or until every head has, in its worst chunk, ``p^K(r) >= stop_at`` and
    ``p^V(r+1) >= stop_at`` for one slot r (``stop_at=None``: run to ``t_max``). The population
    is the exact enumeration where it has at most ``model.max_exact`` sequences, else a fixed
    Monte Carlo sample of ``n_samples`` (the flow is then the flow of that empirical loss).
    """
    t_max = check_real("t_max", t_max, 0.0, low_open=True)
    if stop_at is not None:
        stop_at = check_real("stop_at", stop_at, 0.0, 1.0, low_open=True, high_open=False)
    rho = check_real("rho", rho, 0.0, low_open=True)  # before the population is drawn
    rtol, atol = _check_tolerances(rtol, atol)
    population = _flow_population(model, population, n_samples, seed)
    c0 = random_gate_parameters(model, rho, seed)
    rec = _Recorder(model, population, stop_at)
    with single_threaded():
        t, c, accepted, rejected = integrate(_negative_gradient(model, population), c0, t_max, rtol=rtol,
                                             atol=atol, t_eval=t_eval, callback=rec)
    settings = dict(rho=rho, seed=seed, t_max=t_max, stop_at=stop_at, rtol=rtol, atol=atol,
                    population=population.kind, n_sequences=len(population), accepted_steps=accepted,
                    rejected_steps=rejected)
    return rec.result(model, c0, c, "dormand_prince", settings)


def gradient_descent(model: IdealizedInductionModel, *, learning_rate: float, t_max: float, rho: float = 0.01,
                     seed: int = 0, record_every: int = 1, population: Optional[Population] = None,
                     n_samples: int = 2048) -> FlowResult:
    """Small-step gradient descent ``c_{k+1} = c_k - eta grad L(c_k)`` from the same init as
    `gradient_flow` with the same ``rho`` and ``seed``; step k sits at time ``t = k eta``."""
    learning_rate = check_real("learning_rate", learning_rate, 0.0, low_open=True)
    t_max = check_real("t_max", t_max, 0.0, low_open=True)
    record_every = check_int("record_every", record_every, 1)
    rho = check_real("rho", rho, 0.0, low_open=True)  # before the population is drawn
    population = _flow_population(model, population, n_samples, seed)
    c = c0 = random_gate_parameters(model, rho, seed)
    f = _negative_gradient(model, population)
    rec = _Recorder(model, population, None)
    n_steps = int(round(t_max / learning_rate))
    with single_threaded():
        rec(0.0, c)
        for k in range(1, n_steps + 1):
            c = c + learning_rate * f(c)
            if k % record_every == 0 or k == n_steps:
                rec(k * learning_rate, c)
    settings = dict(rho=rho, seed=seed, t_max=t_max, learning_rate=learning_rate, population=population.kind,
                    n_sequences=len(population), steps=n_steps)
    return rec.result(model, c0, c, "gradient_descent", settings)


def flow_seeds(model: IdealizedInductionModel, seeds: Sequence[int] = range(20), *, threshold: float = 0.95,
               **flow_kwargs) -> FlowSweep:
    """`gradient_flow` from every seed in ``seeds`` (one population shared by all runs)."""
    threshold = check_real("threshold", threshold, 0.0, 1.0, high_open=False, why=" (a slot probability)")
    seeds = [check_int("seeds", s, 0, why=" (each a seed)") for s in seeds]
    if not seeds:
        raise UserInputError("seeds is empty; give at least one seed")
    if "population" not in flow_kwargs or flow_kwargs["population"] is None:
        flow_kwargs["population"] = model.population(n_samples=flow_kwargs.pop("n_samples", 2048), seed=0)
    runs = [gradient_flow(model, seed=s, **flow_kwargs) for s in seeds]
    return FlowSweep(runs=runs, seeds=seeds, threshold=threshold)
