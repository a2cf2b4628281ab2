"""The hook rule (docs/hooks.md), property-based: each call of a hook sees the positions it computes
(``hook.ctx["query_range"]``, a compressor's entries ``hook.ctx["entry_range"]``), and nothing a hook
sees depends on the batch size; chunks are a function of the length and the model, never of the batch.

Hypothesis draws, for both families (``w4s4``, ``dsv4-tiny``): one to three hook points from ALL of the
model's hook points (``model.hook_dict``), an editing hook for each (zero a slice of positions found
through ``hook.ctx``, zero a slice of channels or heads, or scale), the prompt length (short, and above
the lowered chunk threshold), the chunk setting (``"auto"``, None, an integer), the size of the batch
the prompts sit in (1 to 512) and the cut points of a prefill and steps. With the edits attached:

(a) the same prompts alone (batch 1) and at the front of the drawn batch give the same logits, and
    every hook is called with the same ranges and per-row shapes at both sizes;
(b) the drawn chunk setting gives the logits of no chunking (None);
(c) ``last_logits(x)`` is the hooked full forward's last position;
(d) a prefill and steps give the hooked full forward at every position;

all to 1e-4 relative, and the edits move the logits by more than that (the test could fail).
``tests/test_hook_rule.py`` keeps the fixed-size cases of the report that found batch-dependent chunks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers")

TOL = 1e-4  # relative: the bar for every comparison below
M = 2  # "the same few prompts": how many prompts are checked alone and at the front of a batch
TOKEN_BUDGET = 12_288  # tokens in the drawn batch, about: a big batch takes short prompts (time)
# derandomize: the same examples every run (the fast tier is deterministic). The function-scoped
# fixtures are conftest's autouse seed, which nothing here reads (every draw of tokens has its own
# generator), and one_thread, which holds for every example alike.
PROPERTY = settings(derandomize=True, database=None, deadline=None, max_examples=8,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# ----------------------------------------------------------------------------- the hook points
# Every hook point is drawn; these are the ones whose activation is not simply ``[batch, pos, ...]``
# (what "a slice of positions" and "a slice of channels" mean there), and the reasons.
QUERY_ROWS = re.compile(r"\.attn\.hook_(attn_scores|pattern)$")  # [batch, head, query, key_slot], per chunk
INDEX_SCORES = re.compile(r"\.indexer\.hook_scores$")  # [batch, pos, entry]: the entry axis grows with the call
SELECTION = re.compile(r"\.indexer\.hook_selected$")  # [batch, pos, top_k] int64 entry indices (-1: none)
# the compressor's per-entry points: [batch, entry, ...], hook.ctx["entry_range"] names the entries
ENTRIES = re.compile(r"\.compressor\.(indexer\.)?hook_(gate|gate_logits)(_k|_v)?$"
                     r"|\.compressor\.(indexer\.)?hook_(kv|normed_kv|rot_kv|k|v|rot_k)_compressed$")
# Points where a positive scale cancels, so "scale" multiplies by a NEGATIVE factor there (a sign
# flip survives an RMS norm, and reverses the indexer's ranking): (families, pattern, why a positive
# scale is a no-op). These are all of them for w4s4 and dsv4-tiny (a scale by 0.5 and 2 at every other
# point moves the logits by more than 1e-3 relative; measured when this was written).
SCALE_CANCELS = (
    (("w4s4", "dsv4-tiny"), r"^blocks\.LAST\.hook_resid_post$",
     "the last block's output goes to ln_final's RMS norm (DSV4: through hc_head's collapse, linear in "
     "the streams; 7e-5 is left of a 0.5 scale)"),
    (("dsv4-tiny",), r"\.attn\.hook_(q|kv)$", "the RMS norm q_norm / kv_norm follows"),
    (("dsv4-tiny",), r"\.compressor\.(indexer\.)?hook_(token_kv|gate|kv_compressed)$",
     "the entry is a convex sum of the tokens' payloads, RMS-normed (kv_norm) next"),
    (("dsv4-tiny",), r"\.indexer\.hook_(q|normed_kv_compressed|rot_kv_compressed|scores)$",
     "the indexer's scores scale with its queries and keys, and its top-k does not move under a scale"),
)
# Not fired at all by these models (a no-op whatever the edit), so never attached: the own family
# computes hook_result only with use_attn_result=True (w4s4: False). Checked below, not assumed.
NEVER_FIRED = re.compile(r"\.attn\.hook_result$")

KINDS = ("zero_positions", "zero_channels", "scale")


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| relative to max |b| (0 where both are 0: a zeroed last position's logits)."""
    return float((a - b).abs().max() / b.abs().max().clamp_min(torch.finfo(b.dtype).tiny))


def layer_of(name: str) -> Optional[int]:
    found = re.match(r"blocks\.(\d+)\.", name)
    return int(found.group(1)) if found else None


def entry_stride(model, layer: int) -> int:
    """Tokens per compressed entry of ``layer``: entry j closes at ``j * stride + stride - 1`` in both
    families' numbering (docs/hooks.md, "Entry numbering"), so ``T // stride`` entries are closed at T."""
    cfg = model.cfg
    if hasattr(cfg, "compress_rates"):
        return cfg.compress_rates[cfg.layer_types[layer]]
    return cfg.stride


def _zero(t: torch.Tensor) -> torch.Tensor:
    """Zero the finite values (a masked score stays -inf: a zeroed slice never unmasks a key)."""
    return torch.where(torch.isfinite(t), torch.zeros_like(t), t)


def _scale(t: torch.Tensor, factor: float) -> torch.Tensor:
    return torch.where(torch.isfinite(t), t * factor, t)


@dataclass
class Edit:
    """An editing hook at ``name`` for a ``T``-token prompt, written to the hook rule: ``zero_positions``
    zeroes positions ``first ..`` (compressor entries ``entry ..``) of whatever part of them this call
    holds, found through ``hook.ctx``; ``zero_channels`` zeroes the first half of a fixed axis (heads of
    the per-query points, channels elsewhere); ``scale`` multiplies by ``factor``. Each call is checked
    against the rule (its activation covers exactly the range it is told) and recorded in ``calls``."""

    name: str
    kind: str
    first: int  # the first position zeroed
    entry: int  # the first entry zeroed (a compressor's per-entry points)
    factor: float  # negative where a positive scale cancels (SCALE_CANCELS)
    calls: list

    def __call__(self, x: torch.Tensor, hook) -> torch.Tensor:
        name, ctx = self.name, hook.ctx
        span = ctx.get("entry_range") if ENTRIES.search(name) else ctx.get("query_range")
        assert span is not None, f"{name}: no range in hook.ctx {dict(ctx)}"
        axis = 2 if QUERY_ROWS.search(name) else 1
        assert x.shape[axis] == span[1] - span[0], (name, tuple(x.shape), span)
        self.calls.append((name, span, tuple(x.shape[1:])))
        kind = self.kind
        if SELECTION.search(name):  # entry indices: zero means "select nothing" (-1); no scale of an index
            if kind == "zero_positions":
                x = x.clone()
                x[:, max(0, self.first - span[0]):] = -1
                return x
            return torch.where(x % 2 == 0, -1, x)  # drop the even entries (both other kinds)
        if kind == "scale":
            return _scale(x, self.factor)
        x = x.clone()
        if kind == "zero_positions":
            if ENTRIES.search(name):
                x[:, max(0, self.entry - span[0]):] = _zero(x[:, max(0, self.entry - span[0]):])
            elif QUERY_ROWS.search(name):
                x[:, :, max(0, self.first - span[0]):] = _zero(x[:, :, max(0, self.first - span[0]):])
            else:
                x[:, max(0, self.first - span[0]):] = _zero(x[:, max(0, self.first - span[0]):])
        elif QUERY_ROWS.search(name):  # the key-slot axis grows with the call: a slice of heads instead
            x[:, : x.shape[1] // 2] = _zero(x[:, : x.shape[1] // 2])
        elif INDEX_SCORES.search(name):  # the entry axis grows with the call: a fixed slice of entries
            x[..., :4] = _zero(x[..., :4])
        else:
            x[..., : x.shape[-1] // 2] = _zero(x[..., : x.shape[-1] // 2])
        return x


def edits(model, family: str, points, kinds, first: int, factor: float, T: int, calls: list) -> list:
    """``fwd_hooks`` for a ``T``-token prompt: ``first`` in ``1 .. T - 1`` (query 0 sees one key slot, so
    its scores made uniform are unchanged), each layer's first zeroed entry one that is closed by T."""
    hooks = []
    last = str(model.cfg.n_layers - 1)
    for name, kind in zip(points, kinds):
        layer = layer_of(name)
        stride = entry_stride(model, layer) if layer is not None else 1
        entry = min(first // stride, T // stride - 1)
        cancels = any(family in names and re.search(p.replace("LAST", last), name)
                      for names, p, _ in SCALE_CANCELS)
        hooks.append((name, Edit(name, kind, first, entry, -factor if cancels else factor, calls)))
    return hooks


# ----------------------------------------------------------------------------- the families
@dataclass(frozen=True)
class Family:
    name: str
    min_len: int  # dsv4-tiny: its HCA layer closes its first entry at 32 tokens, its CSA indexer
    # chooses among more than top_k = 8 entries from 36 on (below, a query takes every closed entry)
    patches: tuple  # (module, attribute, value): the chunk thresholds lowered to the models' contexts


def _family(name: str) -> Family:
    if name == "dsv4-tiny":
        from phaseinterp.models.hf import chunking

        from phaseinterp.models.hf import attention as hf_attention

        # "auto" chunks above 96 tokens (2,048 unpatched: past dsv4-tiny's 256-token context), blocks of
        # one prompt row within 16,384 elements there, and the MoE/mHC token blocks hold 64 tokens (4,096)
        return Family(name, 40, ((chunking, "AUTO_CHUNK_ABOVE", 96), (chunking, "LONG_SCORE_BLOCK", 16_384),
                                 (hf_attention, "TOKEN_BLOCK", 64)))
    from phaseinterp.models import attention

    # the own compressed attention runs "auto" in blocks of at most FUSED_BLOCK queries (128 unpatched:
    # w4s4's whole context); its AUTO_CHUNK_ABOVE is full attention's only. A hook on hook_attn_scores
    # or hook_pattern runs that layer unchunked (the explicit softmax), whatever the setting.
    return Family(name, 16, ((attention, "FUSED_BLOCK", 32),))


FAMILIES = [pytest.param("w4s4", marks=pytest.mark.zoo("w4s4")),
            pytest.param("dsv4-tiny", marks=pytest.mark.zoo("dsv4-tiny"))]
# one torch thread (conftest): tiny tensors, and two threads fighting over a loaded machine made a
# dsv4-tiny forward ten times slower
pytestmark = pytest.mark.usefixtures("one_thread")


def drawable(model) -> list[str]:
    return sorted(n for n in model.hook_dict if not NEVER_FIRED.search(n))


def prompts(model, n: int, T: int, seed: int) -> torch.Tensor:
    return torch.randint(0, model.cfg.d_vocab, (n, T), generator=torch.Generator().manual_seed(seed))


@dataclass
class Case:
    points: list
    kinds: list
    T: int
    first: int
    factor: float
    batch: int
    chunk: object
    cuts: list
    seed: int


@st.composite
def cases(draw, names: list, n_ctx: int, min_len: int) -> Case:
    points = draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
    kinds = [draw(st.sampled_from(KINDS)) for _ in points]
    T = draw(st.integers(min_len, n_ctx))
    first = draw(st.integers(1, T - 1))
    batch = draw(st.one_of(st.sampled_from([1, 64, 400, 512]), st.integers(1, 512)))
    chunk = draw(st.one_of(st.sampled_from(["auto", None]), st.integers(3, 64)))
    cuts = sorted(draw(st.lists(st.integers(1, T - 1), min_size=1, max_size=4, unique=True)))
    return Case(points, kinds, T, first, draw(st.sampled_from([0.5, 2.0])), batch, chunk, cuts,
                draw(st.integers(0, 2**16)))


def check(model, family: Family, case: Case) -> None:
    """(a) to (d) of the module docstring for one drawn case."""
    T = case.T
    calls: list = []
    hooks = edits(model, family.name, case.points, case.kinds, case.first, case.factor, T, calls)
    x = prompts(model, M, T, case.seed)
    setting = model.query_chunk  # the shared model is left as it was found
    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        for module, attribute, value in family.patches:
            mp.setattr(module, attribute, value)
        try:
            model.set_query_chunk(None)
            clean = model(x)
            whole = model.run_with_hooks(x, fwd_hooks=hooks)
            moved = relative(whole, clean)
            assert moved > TOL, f"the edits {case.points} {case.kinds} move the logits by {moved:.1e} only"
            assert {c[0] for c in calls} == set(case.points), "an edited hook point never fired"
            model.set_query_chunk(case.chunk)
            # (b) the drawn chunk setting against no chunking
            chunked = model.run_with_hooks(x, fwd_hooks=hooks)
            assert relative(chunked, whole) < TOL, ("chunk setting", case.chunk, relative(chunked, whole))
            with model.hooks(fwd_hooks=hooks):
                # (c) last_logits: a prefill (return_type="cache") and one step on a fork
                last = model.last_logits(x)
                # (d) a prefill and steps at the drawn cuts
                cache = model.init_cache()
                bounds = [0, *case.cuts, T]
                steps = torch.cat([model(x[:, a:b], cache=cache) for a, b in zip(bounds, bounds[1:])], 1)
            assert relative(last, whole[:, -1]) < TOL, ("last_logits", relative(last, whole[:, -1]))
            assert cache.length == T
            assert relative(steps, whole) < TOL, ("prefill and steps", case.cuts, relative(steps, whole))
            # (a) the prompts alone and at the front of the drawn batch (short prompts for a big batch)
            Tb = max(family.min_len, min(T, TOKEN_BUDGET // case.batch))
            m = min(M, case.batch)
            ours = x[:m, :Tb]
            fill = prompts(model, case.batch - m, Tb, case.seed + 1)
            alone, traces = [], []
            for i in range(m):
                calls.clear()
                alone.append(model.run_with_hooks(ours[i:i + 1], fwd_hooks=edits(
                    model, family.name, case.points, case.kinds, min(case.first, Tb - 1), case.factor, Tb, calls)))
                traces.append(list(calls))
            calls.clear()
            batched = model.run_with_hooks(torch.cat([ours, fill]), fwd_hooks=edits(
                model, family.name, case.points, case.kinds, min(case.first, Tb - 1), case.factor, Tb, calls))[:m]
            assert all(trace == calls for trace in traces), "a hook's calls depend on the batch size"
            alone = torch.cat(alone)
            assert relative(batched, alone) < TOL, ("batch", case.batch, Tb, relative(batched, alone))
        finally:
            model.set_query_chunk(setting)
    assert not any(point.has_hooks() for point in model.hook_dict.values())


@pytest.mark.parametrize("name", FAMILIES)
def test_an_editing_hook_at_any_hook_point_obeys_the_hook_rule(zoo_model, name):
    model = zoo_model(name)
    family = _family(name)

    @PROPERTY
    @given(case=cases(drawable(model), model.cfg.n_ctx, family.min_len))
    def run(case):
        check(model, family, case)

    run()


# every hook point at once, each kind in turn, at the batch sizes and a chunk setting each
AT_ONCE = [("zero_positions", 512, "auto"), ("zero_channels", 64, 16), ("scale", 400, 7)]


@pytest.mark.parametrize(("kind", "batch", "chunk"), AT_ONCE)
@pytest.mark.parametrize("name", FAMILIES)
def test_every_hook_point_at_once_obeys_the_hook_rule(zoo_model, name, kind, batch, chunk):
    """The draws above reach a few hook points per run; here every one (but NEVER_FIRED) has the edit at
    once, above the lowered chunk threshold, so each run of the fast tier edits every point with every
    kind. One point's edit can hide another's downstream (a zeroed last residual from position T/2 on
    hides every earlier edit there), so this completes the single-point draws, never replaces them."""
    model = zoo_model(name)
    family = _family(name)
    T = 128 if name == "dsv4-tiny" else 100  # above the lowered "auto" thresholds (96, 32)
    points = drawable(model)
    check(model, family, Case(points, [kind] * len(points), T, T // 2, 0.5, batch, chunk,
                              [T // 3, T // 3 + 1, T - 1], 11))


@pytest.mark.parametrize("name", FAMILIES)
def test_every_drawn_hook_point_fires_and_the_others_never_do(zoo_model, name):
    """What the property test draws from is every hook point that fires in a forward over the whole
    context (so an edit there can act); the points it leaves out (NEVER_FIRED) do not fire."""
    model = zoo_model(name)
    fired = set()
    record = lambda t, hook: fired.add(hook.name)  # noqa: E731
    with torch.no_grad(), model.hooks(fwd_hooks=[(lambda n: True, record)]):
        model(prompts(model, 1, model.cfg.n_ctx, 0))
    assert fired == set(drawable(model))


@pytest.mark.parametrize("name", FAMILIES)
def test_every_hook_point_is_told_its_positions(zoo_model, name):
    """A prefill of 12 tokens and a step of 8: every hook point that fires is told (0, 12), then (12, 20)."""
    model = zoo_model(name)
    x = prompts(model, 1, 20, 0)
    seen: dict = {}
    record = lambda t, hook: seen.setdefault(hook.name, []).append(hook.ctx.get("query_range"))  # noqa: E731
    with torch.no_grad(), model.hooks(fwd_hooks=[(lambda n: True, record)]):
        cache = model.init_cache()
        model(x[:, :12], cache=cache)
        model(x[:, 12:], cache=cache)
    told = sorted(n for n, spans in seen.items() if spans == [(0, 12), (12, 20)])
    assert len(told) > len(seen) // 2  # the test reads what it means to
    assert sorted(seen) == told, sorted(set(seen) - set(told))


@pytest.mark.zoo("dsv4-tiny")
def test_dsv4_token_blocks_run_at_every_batch_size(zoo_model):
    """The MoE/mHC token blocks, lowered to dsv4-tiny's context (2,048 and 4,096 tokens unpatched): two
    prompts together give what each gives alone, and what one block gives (``set_query_chunk(None)``)."""
    from phaseinterp.models.hf import attention, chunking

    model = zoo_model("dsv4-tiny")
    x = prompts(model, 2, 100, 0)
    setting = model.query_chunk
    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        mp.setattr(chunking, "AUTO_CHUNK_ABOVE", 64)
        mp.setattr(attention, "TOKEN_BLOCK", 48)
        try:
            model.set_query_chunk(None)
            whole = model(x)
            model.set_query_chunk("auto")
            alone = torch.cat([model(x[i:i + 1]) for i in range(2)])
            assert relative(alone, whole) < TOL
            assert relative(model(x), whole) < TOL
        finally:
            model.set_query_chunk(setting)
