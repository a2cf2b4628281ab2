"""One hook vocabulary (docs/hooks.md): the table lists exactly the hooks each family has, both
families share one key layout and one entry numbering, and a gate hook edits what its name says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from phaseinterp.models.protocol import phase_model
from test_model import make

pytest.importorskip("transformers")
from phaseinterp.models.hf import from_hf  # noqa: E402
from test_deepseek_v4 import CSA, HCA, S, make_hf  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "hooks.md"
SLIDING = "sliding_attention"
L = 6  # the test DSV4's sliding_window

# Own configs that together have every own hook (every kernel and option that adds one).
OWN_CONFIGS = [
    dict(window=4, stride=4),  # gated, separate K/V gates
    dict(window=4, stride=4, tie_kv_gates=True),  # one gate for K and V
    dict(compression="deepseek", gate="vector", window=8, stride=4),  # one gate, one K = V entry
    dict(compression=None),  # the full-attention twin
    dict(window=4, stride=4, qk_norm=True, use_attn_result=True),
]


@pytest.fixture(scope="module")
def dsv4():
    return from_hf(make_hf(layer_types=[CSA, HCA, SLIDING]))


def _generic(names) -> set[str]:
    return {re.sub(r"^blocks\.\d+\.", "blocks.{l}.", n) for n in names}


def _table() -> dict[str, tuple[str, str]]:
    """hook -> (own cell, DSV4 cell) of docs/hooks.md's table."""
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and re.fullmatch(r"`[^`]+`", cells[0]):
            name = cells[0].strip("`")
            assert name not in rows, f"{name} listed twice in docs/hooks.md"
            rows[name] = (cells[2], cells[3])
    return rows


def test_table_lists_exactly_the_hooks_of_each_family(dsv4):
    table = _table()
    own = set()
    for kw in OWN_CONFIGS:
        own |= _generic(make(0, **kw).hook_dict)
    documented_own = {n for n, (o, _) in table.items() if o != "—"}
    documented_hf = {n for n, (_, h) in table.items() if h != "—"}
    assert own == documented_own, (sorted(own - documented_own), sorted(documented_own - own))
    hf = _generic(dsv4.hook_dict)
    assert hf == documented_hf, (sorted(hf - documented_hf), sorted(documented_hf - hf))
    # a sliding-window-only layer has no compressor hooks
    assert not any(n.startswith("blocks.2.attn.compressor") for n in dsv4.hook_dict)


# ---------------------------------------------------------------- key layout
def _entry_formula(t: int, B: int, n_entries: int, S: int, W: int, g: int) -> list[tuple[str, list[int]]]:
    """docs/hooks.md: the band, oldest first, then entry j reading jS+g .. jS+g+W-1 (>= 0), visible from jS+g+W-1."""
    band = [("local", [p]) if p >= 0 else ("masked", []) for p in range(t - B + 1, t + 1)]
    entries = [("entry", list(range(max(0, j * S + g), j * S + g + W))) if j * S + g + W - 1 <= t else ("masked", [])
               for j in range(n_entries)]
    return band + entries


@pytest.mark.parametrize("kw, g", [(dict(window=4, stride=4), 0),
                                   (dict(compression="deepseek", gate="vector", window=8, stride=4), 0)])
def test_own_key_layout_follows_the_formula(kw, g):
    model = make(0, **kw)
    cfg = model.cfg
    B = model.blocks[0].attn.band_width
    _, cache = model.run_with_cache(torch.randint(0, 32, (1, 30)), names_filter="blocks.0.attn.hook_pattern")
    n = cache["blocks.0.attn.hook_pattern"].shape[-1]
    for t in (0, 3, 7, 11, 29):
        want = _entry_formula(t, B, n - B, cfg.stride, cfg.window, g)
        assert model.key_slot_sources(0, t, n) == want
        assert phase_model(model).key_slot_sources(0, t, n) == want


def test_dsv4_key_layout_follows_the_formula(dsv4):
    tokens = torch.randint(0, 64, (1, 30), generator=torch.Generator().manual_seed(0))
    _, cache = dsv4.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    for layer, (W, g, stride) in {0: (2 * S, -S, S), 1: (8, 0, 8)}.items():
        n = cache[f"blocks.{layer}.attn.hook_pattern"].shape[-1]
        assert n == L + 30 // stride
        for t in (0, 3, 7, 11, 29):
            want = _entry_formula(t, L, n - L, stride, W, g)
            assert dsv4.key_slot_sources(layer, t, n) == want
            assert phase_model(dsv4).key_slot_sources(layer, t, n) == want
    assert cache["blocks.2.attn.hook_pattern"].shape[-1] == L  # sliding-only: the band alone
    assert dsv4.key_slot_sources(2, 3) == [("masked", [])] * 2 + [("local", [p]) for p in range(4)]


def test_dsv4_band_hooks_keep_logits_and_edits_land(dsv4):
    """An identity hook on the scores or pattern lays the layer's entries out whole (every entry, -inf
    where not selected) instead of gathering the indexer's top-k: the same logits to 1e-6 (float32 sums
    in another order), and an edit through the layout lands where the layout says."""
    tokens = torch.randint(0, 64, (2, 25), generator=torch.Generator().manual_seed(1))
    names = lambda n: n.endswith(("hook_pattern", "hook_attn_scores"))  # noqa: E731
    with torch.no_grad():
        plain = dsv4(tokens)
        hooked = dsv4.run_with_hooks(tokens, fwd_hooks=[(names, lambda t, hook: t.clone())])
        torch.testing.assert_close(plain, hooked, atol=1e-6, rtol=0)
        _, clean = dsv4.run_with_cache(tokens, names_filter="blocks.0.attn.hook_pattern")

        q = 9  # mask query q's own token (band slot L-1) through the band layout

        def drop_self(scores, hook):
            scores[:, :, q, L - 1] = float("-inf")
            return scores

        with dsv4.hooks(fwd_hooks=[("blocks.0.attn.hook_attn_scores", drop_self)]):
            _, edited = dsv4.run_with_cache(tokens, names_filter="blocks.0.attn.hook_pattern")
    before, after = clean["blocks.0.attn.hook_pattern"], edited["blocks.0.attn.hook_pattern"]
    assert float(before[:, :, q, L - 1].min()) > 0 and float(after[:, :, q, L - 1].abs().max()) == 0.0
    others = [t for t in range(25) if t != q]
    assert torch.equal(before[:, :, others], after[:, :, others])  # layer 0: no other query moves
    assert float((after[:, :, q, : L - 1] - before[:, :, q, : L - 1]).min()) >= 0  # the rest renormalised up


# ---------------------------------------------------------------- gate edits
def _edit_moves(model, gate_hook: str, watched: list[str], tokens) -> dict[str, bool]:
    """Which ``watched`` hooks change when ``gate_hook``'s activation is perturbed (one layer)."""
    def perturb(t, hook):
        return t + torch.linspace(0.5, 1.5, t.shape[2]).reshape(1, 1, -1, *([1] * (t.ndim - 3)))

    with torch.no_grad():
        _, clean = model.run_with_cache(tokens, names_filter=watched, return_cache_object=False)
        with model.hooks(fwd_hooks=[(gate_hook, perturb)]):
            _, edited = model.run_with_cache(tokens, names_filter=watched, return_cache_object=False)
    return {n: not torch.equal(clean[n], edited[n]) for n in watched}


def _own_watched(layer: int = 0, kv_entry: bool = False) -> list[str]:
    c = f"blocks.{layer}.attn.compressor."
    if kv_entry:
        return [c + "hook_kv_compressed", c + "hook_normed_kv_compressed", c + "hook_rot_kv_compressed"]
    return [c + "hook_k_compressed", c + "hook_rot_k_compressed", c + "hook_v_compressed"]


@pytest.mark.parametrize("logits", [True, False])
def test_separate_gate_hooks_move_only_their_branch(logits):
    model = make(0, window=4, stride=4)
    tokens = torch.randint(0, 32, (2, 24))
    c = "blocks.0.attn.compressor."
    for br, moved in (("k", {c + "hook_k_compressed", c + "hook_rot_k_compressed"}), ("v", {c + "hook_v_compressed"})):
        name = phase_model(model).gate_hook(0, br, logits=logits)
        assert name == c + ("hook_gate_logits_" if logits else "hook_gate_") + br
        moves = _edit_moves(model, name, _own_watched(), tokens)
        assert {n for n, m in moves.items() if m} == moved


@pytest.mark.parametrize("kw, kv_entry", [(dict(window=4, stride=4, tie_kv_gates=True), False),
                                          (dict(compression="deepseek", gate="vector", window=8, stride=4), True)])
@pytest.mark.parametrize("logits", [True, False])
def test_shared_gate_hooks_move_k_and_v(kw, kv_entry, logits):
    model = make(0, **kw)
    tokens = torch.randint(0, 32, (2, 24))
    family = phase_model(model)
    name = family.gate_hook(0, "k", logits=logits)
    assert name == family.gate_hook(0, "v", logits=logits) == \
        "blocks.0.attn.compressor." + ("hook_gate_logits" if logits else "hook_gate")
    moves = _edit_moves(model, name, _own_watched(kv_entry=kv_entry), tokens)
    assert all(moves.values()), moves  # K and V entries (own DeepSeek: the one entry, its value and key)
    comp = model.blocks[0].attn.compressor
    assert not any(hasattr(comp, f"hook_gate{x}_{br}") for x in ("", "_logits") for br in "kv")


@pytest.mark.parametrize("logits", [True, False])
def test_dsv4_gate_hooks_move_the_one_kv_entry(dsv4, logits):
    tokens = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(2))
    family = phase_model(dsv4)
    c = "blocks.0.attn.compressor."
    name = family.gate_hook(0, "v", logits=logits)
    assert name == family.gate_hook(0, "k", logits=logits) == c + ("hook_gate_logits" if logits else "hook_gate")
    watched = [c + "hook_kv_compressed", c + "hook_rot_kv_compressed", c + "indexer.hook_kv_compressed"]
    moves = _edit_moves(dsv4, name, watched, tokens)
    assert moves == {watched[0]: True, watched[1]: True, watched[2]: False}
    # the indexer's gate moves the indexer's entries only
    moves = _edit_moves(dsv4, c + "indexer." + ("hook_gate_logits" if logits else "hook_gate"), watched, tokens)
    assert moves == {watched[0]: False, watched[1]: False, watched[2]: True}
    with pytest.raises(ValueError, match="no compressor"):
        family.gate_hook(2, "k")
