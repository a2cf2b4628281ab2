"""The idealized induction model of docs/science.md section 4: equiangular tokens, chunked keys and values.

L chunks of S distinct tokens; m < S heads each compress a chunk with slot distributions
p^K, p^V (``k_j = sum_r p^K(r) x_{j,r}``, ``v_j`` likewise); a head attends over the L
chunks with ``softmax_j(gamma <x_q, k_j>)`` for the query token x_q; the heads' outputs are
summed and unembedded at scale beta, ``logits_y = beta <x_y, o>``; the loss is the
cross-entropy on the successor of the query, a repeated non-final token of the context.
"""

from __future__ import annotations

import itertools
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional, Union

import torch
from jaxtyping import Float, Int
from torch import Tensor

from phaseinterp._checks import check_device, check_int, check_seed, check_real
from phaseinterp.errors import UserInputError  # bad arguments: one line naming the value

# Float64 round-off in X X^T for the sizes used here is ~1e-15; the check allows this much.
GRAM_ATOL = 1e-12


@contextmanager
def single_threaded() -> Iterator[None]:
    """Run the body with one intra-op CPU thread, restoring the previous count on exit (also on
    error). The tensors here are tiny: extra threads only add synchronisation, which costs
    milliseconds per op."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def gram_deviation(embeddings: Float[Tensor, "vocab dim"], kappa: float) -> float:
    """``max_{x, x'} |x.x' - kappa - 1{x = x'}|`` of the rows of ``embeddings``."""
    kappa = check_real("kappa", kappa, 0.0)
    gram = embeddings @ embeddings.T
    target = kappa + torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
    return float((gram - target).abs().max())


def check_equiangular(embeddings: Float[Tensor, "vocab dim"], kappa: float, eps: float) -> float:
    """Raise ValueError unless ``|x.x' - kappa - 1{x = x'}| <= eps`` (+1e-12 round-off) for every
    pair of rows; return the largest deviation."""
    eps = check_real("eps", eps, 0.0)
    dev = gram_deviation(embeddings, kappa)
    if dev > eps + GRAM_ATOL:
        raise UserInputError(f"embeddings are not {eps:g}-nearly equiangular with kappa={kappa:g}: "
                         f"max |x.x' - kappa - 1{{x=x'}}| = {dev:.3g} > eps={eps:g}")
    return dev


def equiangular_embeddings(n_tokens: int, kappa: float, eps: float, *, seed: int = 0,
                           device: Union[str, torch.device, None] = None) -> Float[Tensor, "vocab vocab"]:
    """N rows with Gram matrix ``kappa 11^T + I + E``, E symmetric with entries drawn uniformly
    from ``[-eps, eps]`` (diagonal included); ``X = U diag(sqrt(lambda))`` from the
    eigendecomposition, so ``X X^T`` is the target Gram matrix to round-off.

    ``kappa 11^T + I`` has eigenvalues 1 and ``1 + N kappa``, and ``||E||_2 <= N eps``, so
    ``N eps < 1`` keeps the Gram matrix positive definite: hence the valid range of eps.
    """
    device = check_device(device)
    n_tokens = check_int("N", n_tokens, 2)
    kappa = check_real("kappa", kappa, 0.0)
    eps = check_real("eps", eps, 0.0, 1.0 / n_tokens,
                       why=f" (1/N for N={n_tokens}: larger perturbations can break positive definiteness)")
    seed = check_seed("seed", seed)
    gen = torch.Generator().manual_seed(seed)
    noise = torch.rand(n_tokens, n_tokens, generator=gen, dtype=torch.float64) * 2 - 1
    noise = (noise + noise.T) / 2
    if eps > 0:
        # Scale so the largest entry sits just inside eps: round-off cannot push it past.
        noise = noise * ((eps - 4 * GRAM_ATOL) / noise.abs().max())
    else:
        noise = torch.zeros_like(noise)
    gram = kappa + torch.eye(n_tokens, dtype=torch.float64) + noise
    eigenvalues, vectors = torch.linalg.eigh(gram)
    embeddings = vectors * eigenvalues.clamp_min(0).sqrt()
    check_equiangular(embeddings, kappa, eps)
    return embeddings.to(device) if device is not None else embeddings


@dataclass(frozen=True)
class Population:
    """Sequences the population loss averages over, with their weights.

    ``tokens[b, j, r]``: the token in slot r of chunk j; the query is the token in slot
    ``query_slot[b]`` of chunk 0 (chunks are exchangeable, so fixing the query chunk is exact);
    the target is the token in slot ``query_slot[b] + 1`` of chunk 0. ``exact``: the weighted
    mean over these sequences *is* the population loss (full enumeration, or one representative
    per query slot where a symmetry makes all sequences equal); otherwise a Monte Carlo sample.
    """

    tokens: Int[Tensor, "batch chunk slot"]
    query_slot: Int[Tensor, " batch"]
    weight: Float[Tensor, " batch"]
    exact: bool
    kind: str  # "symmetric", "enumerated" or "monte_carlo"

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


@dataclass(frozen=True)
class LossEstimate:
    """A population cross-entropy: ``value`` with its Monte Carlo ``standard_error``
    (0 when ``exact``) from ``n_sequences`` sequences."""

    value: float
    standard_error: float
    n_sequences: int
    exact: bool

    def __repr__(self) -> str:
        err = "exact" if self.exact else f"± {self.standard_error:.2g} (MC, n={self.n_sequences})"
        return f"LossEstimate({self.value:.6f} {err})"


class IdealizedInductionModel:
    """``IdealizedInductionModel(N, S, L, heads=m, eps, kappa, gamma, beta)`` (docs/science.md section 4).

    Args:
        N: vocabulary size, ``N >= L*S``.
        S: slots per chunk, ``S >= 2``.
        L: chunks in the context, ``L >= 2``.
        heads: m, ``1 <= m < S``.
        eps, kappa: embeddings satisfy ``|x.x' - kappa - 1{x = x'}| <= eps``; ``0 <= eps < 1/N``.
        gamma: attention scale (> 0). beta: unembedding scale (> 0).
        seed: the draw of the Gram perturbation E.
        max_exact: populations up to this many sequences are enumerated exactly."""

    def __init__(self, N: int, S: int, L: int, heads: int, eps: float = 0.0, kappa: float = 0.1,
                 gamma: float = 2.0, beta: float = 4.0, *, seed: int = 0, max_exact: int = 50_000,
                 device: Union[str, torch.device, None] = None):
        self.S = check_int("S", S, 2)
        self.L = check_int("L", L, 2, why=" (one chunk makes attention trivial)")
        self.N = check_int("N", N, S * L, why=f" (N >= L*S = {S * L}: each context holds L*S distinct tokens)")
        self.heads = check_int("heads", heads, 1, S - 1, why=f" (m < S = {S} heads)")
        self.kappa = check_real("kappa", kappa, 0.0)
        self.eps = check_real("eps", eps, 0.0, 1.0 / N, why=f" (1/N for N={N})")
        self.gamma = check_real("gamma", gamma, 0.0, low_open=True)
        self.beta = check_real("beta", beta, 0.0, low_open=True)
        self.seed = check_seed("seed", seed)
        self.max_exact = check_int("max_exact", max_exact, 1)
        self.embeddings = equiangular_embeddings(N, kappa, eps, seed=seed, device=device)
        self.gram = self.embeddings @ self.embeddings.T

    @property
    def device(self) -> torch.device:
        return self.embeddings.device

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])

    def config(self) -> dict:
        return dict(N=self.N, S=self.S, L=self.L, heads=self.heads, eps=self.eps, kappa=self.kappa,
                    gamma=self.gamma, beta=self.beta, seed=self.seed)

    def __repr__(self) -> str:
        return ("IdealizedInductionModel(N={N}, S={S}, L={L}, heads={heads}, eps={eps:g}, kappa={kappa:g}, "
                "gamma={gamma:g}, beta={beta:g})").format(**self.config())

    # ---- populations -------------------------------------------------------------------------

    def n_sequences(self) -> int:
        """Size of the full population: ordered L*S-tuples of distinct tokens x (S-1) query slots."""
        return math.perm(self.N, self.S * self.L) * (self.S - 1)

    def population(self, *, symmetric: bool = False, n_samples: int = 4096, seed: int = 0) -> Population:
        """The sequences a loss averages over.

        ``symmetric=True`` (valid for content-independent gates at eps = 0, where every context
        of distinct tokens is a relabelling of every other): one sequence per query slot, exact.
        Otherwise the full enumeration when it has at most ``max_exact`` sequences, else
        ``n_samples`` uniform draws (seeded), a Monte Carlo estimate.
        """
        S, L = self.S, self.L
        seed = check_seed("seed", seed)
        slots = torch.arange(S - 1)
        if symmetric:
            if self.eps != 0:
                raise UserInputError(f"symmetric=True needs eps=0 (got eps={self.eps:g}): "
                                 "perturbed embeddings make contexts differ")
            tokens = torch.arange(S * L).reshape(1, L, S).expand(S - 1, L, S).clone()
            return self._population(tokens, slots, True, "symmetric")
        if self.n_sequences() <= self.max_exact:
            contexts = torch.tensor(list(itertools.permutations(range(self.N), S * L)), dtype=torch.long)
            tokens = contexts.reshape(-1, 1, L, S).expand(-1, S - 1, L, S).reshape(-1, L, S)
            return self._population(tokens, slots.repeat(contexts.shape[0]), True, "enumerated")
        n_samples = check_int("n_samples", n_samples, 2)
        gen = torch.Generator().manual_seed(seed)
        keys = torch.rand(n_samples, self.N, generator=gen)
        tokens = keys.argsort(dim=1)[:, : S * L].reshape(n_samples, L, S)
        query = torch.randint(0, S - 1, (n_samples,), generator=gen)
        return self._population(tokens, query, False, "monte_carlo")

    def _population(self, tokens, query, exact: bool, kind: str) -> Population:
        n = tokens.shape[0]
        weight = torch.full((n,), 1.0 / n, dtype=torch.float64)
        return Population(tokens.to(self.device), query.to(self.device), weight.to(self.device), exact, kind)

    # ---- the forward pass --------------------------------------------------------------------

    def sequence_losses(self, key_gates: Float[Tensor, "..."], value_gates: Float[Tensor, "..."],
                        population: Population) -> Float[Tensor, "..."]:
        """Cross-entropy on the target of every sequence of ``population``: ``[*config, batch]``.

        Gates broadcast to ``[*config, batch, head, chunk, slot]``: ``key_gates[..., b, h, j, r]``
        is p^K_h(r) in chunk j of sequence b (content-dependent gates), or ``[*config, 1, head, 1,
        slot]`` for static ones (see `static_gates`). With G = X X^T and context tokens t_{j,r}:
        ``score_{h,j} = gamma sum_r p^K_{h,j}(r) G[q, t_{j,r}]``, ``a_h = softmax_j(score_h)``,
        ``logit_y = beta sum_{h,j,r} a_{h,j} p^V_{h,j}(r) G[y, t_{j,r}]``,
        ``loss = logsumexp_y(logit_y) - logit_target``.
        """
        tokens, qslot = population.tokens, population.query_slot
        n = tokens.shape[0]
        rows = torch.arange(n, device=tokens.device)
        query = tokens[rows, 0, qslot]
        target = tokens[rows, 0, qslot + 1]
        lead = torch.broadcast_shapes(key_gates.shape[:-3], value_gates.shape[:-3], (n,))
        shape = (*lead, self.heads, self.L, self.S)
        key_gates, value_gates = key_gates.expand(shape), value_gates.expand(shape)
        query_overlap = self.gram[query[:, None, None], tokens]  # [b, chunk, slot]
        scores = self.gamma * torch.einsum("...bhjr,bjr->...bhj", key_gates, query_overlap)
        attention = scores.softmax(dim=-1)
        # Weight each context token's value receives, summed over heads: [..., b, chunk, slot].
        token_weight = torch.einsum("...bhj,...bhjr->...bjr", attention, value_gates)
        logits = self.beta * torch.einsum("...bjr,bjry->...by", token_weight, self.gram[tokens])
        target_logit = logits.gather(-1, target.expand(lead).unsqueeze(-1)).squeeze(-1)
        return logits.logsumexp(dim=-1) - target_logit

    @staticmethod
    def static_gates(p: Float[Tensor, "*config head slot"]) -> Float[Tensor, "*config 1 head 1 slot"]:
        """Content-independent slot distributions in the gate layout of `sequence_losses`."""
        return p[..., None, :, None, :]

    def loss(self, key_gates: Float[Tensor, "..."], value_gates: Float[Tensor, "..."],
             population: Population) -> Float[Tensor, "*config"]:
        """Weighted mean of `sequence_losses` over the population (differentiable)."""
        return (population.weight * self.sequence_losses(key_gates, value_gates, population)).sum(-1)

    def expected_loss(self, p_key: Float[Tensor, "head slot"], p_value: Float[Tensor, "head slot"],
                      population: Optional[Population] = None) -> LossEstimate:
        """Population cross-entropy of static (content-independent) slot distributions, with its
        standard error; by default exact (the eps = 0 symmetry, or enumeration) where tractable."""
        p_key, p_value = self.check_distributions(p_key, "p_key"), self.check_distributions(p_value, "p_value")
        if population is None:
            population = self.population(symmetric=self.eps == 0)
        with torch.no_grad():
            losses = self.sequence_losses(self.static_gates(p_key), self.static_gates(p_value), population)
        value = float((population.weight * losses).sum())
        se = 0.0 if population.exact else float(losses.std() / math.sqrt(len(population)))
        return LossEstimate(value, se, len(population), population.exact)

    def check_distributions(self, p: Tensor, name: str) -> Tensor:
        """``p`` as a float64 ``[head, slot]`` tensor of probability vectors, or ValueError."""
        p = torch.as_tensor(p, dtype=torch.float64, device=self.device)
        if p.shape != (self.heads, self.S):
            raise UserInputError(f"{name} has shape {tuple(p.shape)}; expected (heads, S) = ({self.heads}, {self.S})")
        if not torch.isfinite(p).all() or (p < -1e-9).any() or ((p.sum(-1) - 1).abs() > 1e-6).any():
            raise UserInputError(f"{name} rows must be probability vectors (entries >= 0, sum 1); got {p.tolist()}")
        p = p.clamp_min(0)
        return p / p.sum(-1, keepdim=True)

    def claimed_minimizer(self, slots) -> tuple[Tensor, Tensor]:
        """Theorem 1's configuration for the given key slots r_h: ``p^K_h = e_{r_h}``, ``p^V_h = e_{r_h+1}``."""
        slots = list(slots)
        if len(slots) != self.heads or any(not 0 <= r <= self.S - 2 for r in slots):
            raise UserInputError(f"slots={slots} must give one key slot in 0..{self.S - 2} per head ({self.heads})")
        eye = torch.eye(self.S, dtype=torch.float64, device=self.device)
        return eye[slots], eye[[r + 1 for r in slots]]
