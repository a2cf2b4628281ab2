"""The idealized induction model (docs/science.md section 4): construction, equations, the two claims.

Sizes are tiny (S = 3 or 4, L = 2) so every test takes seconds; all draws are seeded.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from phaseinterp import theory
from phaseinterp.results import dumps
from phaseinterp.theory import IdealizedInductionModel


def tiny(**kwargs) -> IdealizedInductionModel:
    args = dict(N=6, S=3, L=2, heads=2, gamma=2.0, beta=4.0)
    args.update(kwargs)
    return IdealizedInductionModel(**args)


# ---- construction and validation -----------------------------------------------------------


@pytest.mark.parametrize("eps", [0.0, 0.01, 0.15])
def test_embeddings_are_nearly_equiangular(eps):
    x = theory.equiangular_embeddings(6, kappa=0.2, eps=eps, seed=3)
    gram = x @ x.T
    dev = (gram - 0.2 - torch.eye(6, dtype=x.dtype)).abs()
    assert dev.max() <= eps + 1e-12
    if eps > 0:
        assert dev.max() > 0.5 * eps  # the perturbation is really there, not silently dropped
    assert theory.check_equiangular(x, 0.2, eps) == pytest.approx(float(dev.max()))


def test_check_equiangular_rejects_a_violation():
    x = theory.equiangular_embeddings(5, kappa=0.1, eps=0.0)
    x[0] *= 1.01  # |x_0|^2 = 1.1 * 1.0201: off by 0.022
    with pytest.raises(ValueError, match="not 0.01-nearly equiangular"):
        theory.check_equiangular(x, 0.1, 0.01)


@pytest.mark.parametrize("kwargs, match", [
    (dict(heads=3), r"heads=3 is out of range \(valid: 1..2\)"),
    (dict(heads=0), r"heads=0 is out of range"),
    (dict(N=5), r"N=5 must be an integer >= 6"),
    (dict(L=1, N=6), r"L=1 must be an integer >= 2"),
    (dict(S=1, heads=1), r"S=1 must be an integer >= 2"),
    (dict(eps=0.2), r"eps=0.2 is out of range \[0, 0.166667\)"),
    (dict(eps=-0.01), r"eps=-0.01 is out of range"),
    (dict(kappa=-0.5), r"kappa=-0.5 must be >= 0"),
    (dict(gamma=0.0), r"gamma=0 must be > 0"),
    (dict(beta=float("nan")), r"beta=nan must be a finite number"),
])
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tiny(**kwargs)


def test_bad_distributions_and_flow_arguments_raise():
    model = tiny()
    with pytest.raises(ValueError, match=r"shape \(3, 3\); expected \(heads, S\) = \(2, 3\)"):
        model.expected_loss(torch.full((3, 3), 1 / 3), torch.full((3, 3), 1 / 3))
    with pytest.raises(ValueError, match="probability vectors"):
        model.expected_loss(torch.ones(2, 3), torch.full((2, 3), 1 / 3))
    with pytest.raises(ValueError, match=r"slots=\[2, 0\] must give one key slot in 0..1"):
        model.claimed_minimizer([2, 0])
    with pytest.raises(ValueError, match="rho=0 must be > 0"):
        theory.gradient_flow(model, rho=0.0)
    with pytest.raises(ValueError, match="stop_at=1.5 is out of range"):
        theory.gradient_flow(model, stop_at=1.5)


# ---- the equations -------------------------------------------------------------------------


def reference_losses(model, key, value, population):
    """Per-sequence loss computed the long way, in embedding space, one sequence at a time."""
    x = model.embeddings
    out = []
    for b in range(len(population)):
        tok, r = population.tokens[b], int(population.query_slot[b])
        q = x[tok[0, r]]
        o = torch.zeros(x.shape[1], dtype=x.dtype)
        for h in range(model.heads):
            keys = torch.stack([sum(key[b, h, j, s] * x[tok[j, s]] for s in range(model.S)) for j in range(model.L)])
            vals = torch.stack([sum(value[b, h, j, s] * x[tok[j, s]] for s in range(model.S)) for j in range(model.L)])
            attn = torch.softmax(model.gamma * keys @ q, 0)
            o = o + attn @ vals
        logits = model.beta * x @ o
        out.append(torch.logsumexp(logits, 0) - logits[tok[0, r + 1]])
    return torch.stack(out)


def test_forward_matches_a_direct_computation():
    model = tiny(eps=0.1, N=7, max_exact=1)
    population = model.population(n_samples=20, seed=1)
    c = theory.random_gate_parameters(model, rho=2.0, seed=4)
    key, value = theory.gate_distributions(model, c, population)
    got = model.sequence_losses(key, value, population)
    assert torch.allclose(got, reference_losses(model, key, value, population), atol=1e-10)


def test_symmetric_population_equals_full_enumeration_at_eps_zero():
    model = tiny()
    gen = torch.Generator().manual_seed(0)
    pk, pv = torch.rand(2, 3, generator=gen, dtype=torch.float64), torch.rand(2, 3, generator=gen, dtype=torch.float64)
    pk, pv = pk / pk.sum(-1, keepdim=True), pv / pv.sum(-1, keepdim=True)
    full = model.expected_loss(pk, pv, model.population())
    sym = model.expected_loss(pk, pv, model.population(symmetric=True))
    assert full.exact and sym.exact and full.n_sequences == 1440 and sym.n_sequences == 2
    assert sym.value == pytest.approx(full.value, abs=1e-12)
    with pytest.raises(ValueError, match="symmetric=True needs eps=0"):
        tiny(eps=0.05).population(symmetric=True)


def test_monte_carlo_estimate_states_its_error_and_covers_the_exact_value():
    exact_model = tiny(eps=0.1, N=7, max_exact=10**6)
    mc_model = tiny(eps=0.1, N=7, max_exact=10)
    pk = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3]], dtype=torch.float64)
    pv = torch.tensor([[0.1, 0.7, 0.2], [0.3, 0.3, 0.4]], dtype=torch.float64)
    exact = exact_model.expected_loss(pk, pv, exact_model.population())
    mc = mc_model.expected_loss(pk, pv, mc_model.population(n_samples=3000, seed=2))
    assert exact.exact and exact.standard_error == 0 and not mc.exact
    assert 0 < mc.standard_error < 0.05
    assert abs(mc.value - exact.value) < 4 * mc.standard_error
    assert "MC, n=3000" in repr(mc)


# ---- Theorem 1 -----------------------------------------------------------------------------


def test_a_wrong_configuration_scores_worse():
    model = tiny(N=8, S=4, heads=3)
    right = model.expected_loss(*model.claimed_minimizer([0, 1, 2])).value
    eye = torch.eye(4, dtype=torch.float64)
    wrong = {
        "collision": (eye[[0, 0, 2]], eye[[1, 1, 3]]),
        "value on the key slot": (eye[[0, 1, 2]], eye[[0, 1, 2]]),
        "boundary key slot": (eye[[0, 1, 3]], eye[[1, 2, 0]]),
        "uniform": (torch.full((3, 4), 0.25), torch.full((3, 4), 0.25)),
        "half concentrated": (0.5 * eye[[0, 1, 2]] + 0.125, 0.5 * eye[[1, 2, 3]] + 0.125),
    }
    for name, (pk, pv) in wrong.items():
        assert model.expected_loss(pk, pv).value > right + 1e-3, name


@pytest.mark.parametrize("N, S, m, gamma, beta", [(6, 3, 2, 2.0, 4.0), (6, 3, 2, 8.0, 1.0), (9, 3, 2, 0.5, 8.0),
                                                  (8, 4, 3, 2.0, 4.0), (8, 4, 3, 8.0, 1.0)])
def test_theorem1_minimizer_is_concentrated_with_distinct_slots_when_m_is_S_minus_1(N, S, m, gamma, beta):
    """Global search at eps = 0: every minimizer is p^K_h = e_{r_h}, p^V_h = e_{r_h+1}, distinct r_h
    (benchmarks/theory_claims.py runs the wider grid, S up to 5)."""
    result = theory.global_search(IdealizedInductionModel(N, S, 2, heads=m, gamma=gamma, beta=beta),
                                  n_random=4, n_refine_best=2, steps=100)
    assert result.holds(), result.one_hot.head()
    assert result.margin > 1e-3
    mins = result.minimizers()
    assert all(len(set(k)) == m for k in mins.key_slots)  # distinct slots across heads
    # Refinement from random interior points does not find anything lower.
    assert result.best_refined_loss >= result.best_one_hot_loss - 1e-9


@pytest.mark.parametrize("N, S, m", [(6, 3, 1), (8, 4, 2)])
def test_theorem1_fails_when_a_non_boundary_slot_has_no_head(N, S, m):
    """Measured, not assumed: with m < S-1 heads a spread (hedging) configuration beats every
    one-hot assignment, so the claim holds only for m = S-1 in this model (docs/idealized_model.md)."""
    result = theory.global_search(IdealizedInductionModel(N, S, 2, heads=m, gamma=2.0, beta=4.0),
                                  n_random=4, n_refine_best=2, steps=100)
    assert not result.holds()
    assert result.best_refined_loss < result.best_one_hot_loss - 0.05
    best = result.refined.loc[result.refined.loss.idxmin()]
    assert best.max_p_key < 0.95


def test_projection_onto_simplex():
    gen = torch.Generator().manual_seed(0)
    v = torch.randn(50, 4, generator=gen, dtype=torch.float64) * 2
    p = theory.project_to_simplex(v)
    assert torch.allclose(p.sum(-1), torch.ones(50, dtype=torch.float64)) and (p >= 0).all()
    # Optimality: no other simplex point (random draws and vertices) is closer to v.
    others = torch.cat([torch.eye(4, dtype=torch.float64),
                        torch.distributions.Dirichlet(torch.ones(4, dtype=torch.float64)).sample((200,))])
    assert ((v[:, None] - others[None]).norm(dim=-1) >= (v - p).norm(dim=-1, keepdim=True) - 1e-12).all()
    assert torch.equal(theory.project_to_simplex(torch.tensor([[5.0, 0.0, 0.0]])), torch.tensor([[1.0, 0.0, 0.0]]))


# ---- Theorem 2: the gradient flow ----------------------------------------------------------


def test_integrator_order_on_a_known_solution():
    t, y, accepted, rejected = theory.integrate(lambda y: -y * torch.tensor([1.0, 3.0], dtype=torch.float64),
                                                torch.ones(2, dtype=torch.float64), 2.0, rtol=1e-10, atol=1e-12)
    assert t == pytest.approx(2.0)
    assert torch.allclose(y, torch.tensor([math.exp(-2), math.exp(-6)], dtype=torch.float64), rtol=1e-8)
    assert accepted > 5


def test_theorem2_flow_concentrates_each_head_on_one_slot():
    """From small random inits every head reaches p^K(r_h) >= 0.95 and p^V(r_h+1) >= 0.95 in the
    worst chunk of the exact population, its slot fixed once chosen; we expect this of every
    seed here (benchmarks/theory_claims.py: 50/50 seeds in this regime)."""
    model = tiny()
    population = model.population()
    assert population.exact
    sweep = theory.flow_seeds(model, [0, 1, 2], rho=0.01, t_max=3000, stop_at=0.95, rtol=1e-5, atol=1e-8,
                              population=population)
    s = sweep.to_dict()
    assert s["fraction_reached"] == 1.0 and s["fraction_slot_fixed"] == 1.0
    assert 0.0 <= s["collision_frequency"] <= 1.0 and s["chance_collision"] == pytest.approx(0.5)
    for run in sweep.runs:
        final = run.final()
        assert (final.p_key >= 0.95).all() and (final.p_value >= 0.95).all()
        assert all(0 <= r <= model.S - 2 for r in run.slots())
        assert run.loss[-1] < run.loss[0] - 0.5


def test_loss_decreases_monotonically_along_the_flow():
    model = tiny(max_exact=1)
    population = model.population(n_samples=256, seed=0)
    run = theory.gradient_flow(model, rho=0.3, seed=5, t_max=400, stop_at=None, population=population,
                               t_eval=np.linspace(5, 400, 80))
    assert len(run.t) >= 80
    assert run.max_loss_increase() <= 1e-12, np.diff(run.loss).max()
    assert run.loss[-1] < run.loss[0] - 0.3


def test_small_step_gradient_descent_matches_the_flow():
    """Euler steps of size eta converge to the ODE solution at rate O(eta): halving eta halves the gap."""
    model = tiny(max_exact=1)
    population = model.population(n_samples=128, seed=0)
    times = [25.0, 50.0, 100.0]
    ode = theory.gradient_flow(model, rho=0.5, seed=1, t_max=100, stop_at=None, t_eval=times, population=population,
                               rtol=1e-9, atol=1e-12)
    at = [int(np.argmin(np.abs(ode.t - t))) for t in times]
    assert np.allclose(ode.t[at], times)
    gaps = []
    for eta in (2.5, 1.25):
        gd = theory.gradient_descent(model, learning_rate=eta, t_max=100, rho=0.5, seed=1, population=population,
                                     record_every=round(25 / eta))
        assert all(np.isclose(gd.t, t).any() for t in times)
        gd_at = [int(np.argmin(np.abs(gd.t - t))) for t in times]
        gaps.append(np.abs(gd.mean_p[gd_at] - ode.mean_p[at]).max())
    assert gaps[1] < 0.01
    assert 1.6 < gaps[0] / gaps[1] < 2.5, gaps
    # The flow really moved over this window: agreement is not trivial.
    assert np.abs(ode.mean_p[at[-1]] - ode.mean_p[0]).max() > 0.1


# ---- result objects ------------------------------------------------------------------------


def test_result_objects_protocol(tmp_path):
    """Every theory result is on the shared protocol (`phaseinterp.results.Result`): a summary
    table, JSON-ready headline numbers, meta.json + arrays.npz (a sweep's or a grid's nested
    results in subfolders), == by content after a round trip, and != when any content differs."""
    model = tiny(max_exact=1)
    population = model.population(n_samples=64, seed=0)
    sweep = theory.flow_seeds(model, [0, 1], rho=0.5, t_max=100, stop_at=0.9, population=population, rtol=1e-4,
                              atol=1e-6)
    run = sweep.runs[0]
    descent = theory.gradient_descent(model, learning_rate=2.5, t_max=10, rho=0.5, seed=0, population=population)
    search = theory.global_search(tiny(), n_random=2, n_refine_best=1, steps=20)
    bare = theory.global_search(tiny(), n_random=0, n_refine_best=0)  # no refinement: an empty table
    grid = theory.SearchGrid(results=[search, bare])
    for obj in (run, descent, sweep, search, bare, grid):
        name = type(obj).__name__
        text = repr(obj)
        assert text.startswith(f"<{name}") and len(text.splitlines()) <= 18, text
        assert "<table" in obj._repr_html_()
        table = obj.summary()
        assert isinstance(table, pd.DataFrame) and list(table.index) == list(obj.to_dict())
        assert json.loads(dumps(obj.to_dict()))  # headline numbers are JSON-ready
        assert len(obj.to_frame()) > 0 and len(obj.plot().data) > 0
        folder = obj.save(tmp_path / f"{name}-{id(obj)}")
        assert {"meta.json", "arrays.npz"} <= {p.name for p in folder.iterdir()}
        again = type(obj).load(folder)
        assert again == obj and again == type(obj).load(folder), name
        assert repr(again) == repr(obj)
        pd.testing.assert_frame_equal(again.to_frame(), obj.to_frame())
    # A sweep and a grid keep each nested result in its own folder, in the same format.
    assert theory.FlowResult.load(tmp_path / f"FlowSweep-{id(sweep)}" / "runs" / "1") == sweep.runs[1]
    assert theory.SearchResult.load(tmp_path / f"SearchGrid-{id(grid)}" / "results" / "1") == bare
    # Different contents are not equal, down to one number of one nested run.
    assert run != sweep.runs[1] and run != descent and search != bare
    assert run != replace(run, loss=run.loss + np.eye(1, len(run.loss))[0] * 1e-12)
    assert run != replace(run, settings={**run.settings, "seed": 7})
    assert sweep != replace(sweep, threshold=0.9)
    assert sweep != theory.FlowSweep(runs=sweep.runs[:1], seeds=sweep.seeds[:1])
    nudged = replace(sweep.runs[1], final_gates=sweep.runs[1].final_gates + 1e-9)
    assert sweep != replace(sweep, runs=[run, nudged])
    assert search != replace(search, refined=search.refined.assign(loss=search.refined.loss + 1e-9))
    assert grid != theory.SearchGrid(results=[bare, search]) and grid != theory.SearchGrid(results=[search])
    # The numbers the old summary dicts gave.
    s = sweep.to_dict()
    assert s["seeds"] == 2 and s["threshold"] == 0.95 and s["chance_collision"] == pytest.approx(0.5)
    assert s["fraction_reached"] == float(sweep.to_frame().reached.mean())
    assert run.to_dict()["slots"] == run.slots() and run.to_dict()["records"] == len(run.t)
    assert grid.to_dict() == dict(grid_points=2, holds=2, min_margin=search.margin, all_hold=True)
    assert list(grid.to_frame().best_refined_loss) == [search.best_refined_loss, math.inf]
    frame = run.to_frame()
    assert set(frame.columns) >= {"t", "head", "branch", "slot", "mean_p", "min_p", "loss"}
    assert len(frame) == len(run.t) * 2 * 2 * 3
    assert run.concentration().shape == (len(run.t), 2, 2)


def test_a_nested_result_of_an_unknown_kind_is_refused(tmp_path):
    model = tiny(max_exact=1)
    sweep = theory.flow_seeds(model, [0], rho=0.5, t_max=5, stop_at=None, rtol=1e-3, atol=1e-5,
                              population=model.population(n_samples=16, seed=0))
    folder = sweep.save(tmp_path / "sweep")
    meta = json.loads((folder / "meta.json").read_text())
    meta["results"]["runs"]["kinds"] = ["nowhere.NoSuchResult"]
    del meta["content_sha256"]  # else the edit is refused as a changed file, before the kinds are read
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"runs/0 holds a nowhere.NoSuchResult, not a known result class"):
        theory.FlowSweep.load(folder)


def test_chance_collision():
    assert theory.chance_collision(1, 3) == 0.0
    assert theory.chance_collision(2, 2) == pytest.approx(0.5)
    assert theory.chance_collision(3, 3) == pytest.approx(1 - 2 / 9)
