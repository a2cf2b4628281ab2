"""The hook rule (docs/hooks.md, TransformerLens's): each call of a hook sees the positions that call
computes (``hook.ctx["query_range"]`` says which), and nothing a hook sees depends on the batch size.

An editing hook at every kind of hook point (per-query scores and patterns, per-token K/V, the
per-head output, the compressor's gates and entries, the indexer's scores) must give the same logits
for the same prompts alone and inside batches of 64, 400 and 512 other prompts, and under every chunk
setting when the edit reads ``ctx["query_range"]``.
"""

from __future__ import annotations

import pytest
import torch

import phaseinterp as pi

pytest.importorskip("transformers")

T = 128  # the length of the report that found batch-dependent chunks (dsv4-tiny, 128-token prompts)
ROW = 10  # the query row a "naive" edit zeroes by index, as a TransformerLens user writes it


def _rows(pattern: torch.Tensor, hook) -> tuple[int, int]:
    """(first query position, number of query rows) of a ``[batch, head, query, key_slot]`` activation."""
    a, b = hook.ctx.get("query_range", (0, pattern.shape[-2]))
    return a, b - a


def zero_row_naive(pattern, hook):
    """The edit a user writes: zero query row ROW by index, trusting the activation to start at 0."""
    pattern[:, :, ROW] = 0
    return pattern


def zero_row_by_position(pattern, hook):
    """The same edit, reading which positions this call covers (works under any chunking)."""
    a, n = _rows(pattern, hook)
    if a <= ROW < a + n:
        pattern[:, :, ROW - a] = 0
    return pattern


def one_hot_slot(gate, hook):
    """Every entry reads slot 0 only (a scale of the gate would cancel in the entry's RMS norm)."""
    edited = torch.zeros_like(gate)
    edited[:, :, 0] = 1
    return edited


def flip_half(t, hook):
    """Negate the first half of the channels (a scale would cancel in the RMS norm that follows)."""
    edited = t.clone()
    edited[..., : t.shape[-1] // 2] *= -1
    return edited


def scale(factor):
    def edit(t, hook):
        return t * factor
    return edit


def add_to_scores(scores, hook):
    """Halve every finite score (a temperature; an added constant would cancel in the softmax)."""
    return torch.where(torch.isfinite(scores), scores * 0.5, scores)


def negate_scores(scores, hook):
    """The indexer then selects its lowest-scored entries (an added constant would keep the top-k)."""
    return torch.where(torch.isfinite(scores), -scores, scores)


DSV4_EDITS = {
    "blocks.0.attn.hook_pattern": zero_row_by_position,  # a cache call (last_logits' step) starts past 0
    "blocks.1.attn.hook_attn_scores": add_to_scores,
    "blocks.0.attn.hook_kv": flip_half,
    "blocks.1.attn.hook_z": scale(1.5),
    "blocks.0.attn.compressor.hook_gate": one_hot_slot,
    "blocks.2.attn.compressor.hook_rot_kv_compressed": scale(2.0),
    "blocks.0.attn.compressor.indexer.hook_scores": negate_scores,
}


@pytest.fixture(scope="module")
def dsv4():
    return pi.load("dsv4-tiny")


def _prompts(model, n, seed):
    return torch.randint(0, model.cfg.d_vocab, (n, T), generator=torch.Generator().manual_seed(seed))


def _relative(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("hook_name", sorted(DSV4_EDITS))
def test_dsv4_an_editing_hook_gives_the_same_logits_at_every_batch_size(dsv4, hook_name):
    """The same prompts alone and at the front of batches of up to 512 other prompts:
    logits equal to 1e-4 relative with the edit attached (before the fix, a pattern edit by row index
    moved logits by 10.9 between batch 64 and 400 and raised IndexError at 512)."""
    # the reported hook point with the report's 64 prompts at every size of the report; the others
    # with 8 prompts at 1, 8 and 96 (time)
    reported = hook_name == "blocks.0.attn.hook_pattern"
    m = 64 if reported else 8
    ours = _prompts(dsv4, m, 0)
    fill = _prompts(dsv4, 512 - m, 1)
    hooks = [(hook_name, DSV4_EDITS[hook_name])]
    sizes = (64, 400, 512) if reported else (8, 96)
    with torch.no_grad():
        clean = dsv4(ours)
        alone = torch.cat([dsv4.run_with_hooks(ours[i:i + 1], fwd_hooks=hooks) for i in range(2)])
        per_batch = {n: dsv4.run_with_hooks(torch.cat([ours, fill[: n - m]]), fwd_hooks=hooks)[:m] for n in sizes}
    first = per_batch[sizes[0]]
    assert _relative(first, clean) > 1e-3, f"the edit at {hook_name} changes nothing: the test could not fail"
    assert _relative(alone, first[:2]) < 1e-4, (hook_name, 1)
    for n, logits in per_batch.items():
        assert _relative(logits, first) < 1e-4, (hook_name, n)


def test_dsv4_a_position_aware_edit_is_the_same_under_every_chunk_setting(dsv4):
    """With ``ctx["query_range"]`` the edit means the same position however the queries are chunked:
    one chunk, chunks of 16, 48 and "auto" give the same logits (1e-4 relative); the hook is called
    once per chunk and the ranges it saw cover every query once."""
    tokens = _prompts(dsv4, 2, 2)
    seen = []

    def record(pattern, hook):
        seen.append(hook.ctx["query_range"])
        return zero_row_by_position(pattern, hook)

    results = {}
    try:
        for setting in ("auto", None, 16, 48):
            dsv4.set_query_chunk(setting)
            seen.clear()
            with torch.no_grad():
                results[setting] = dsv4.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_pattern", record)])
            assert seen[0][0] == 0 and seen[-1][1] == T and all(x[1] == y[0] for x, y in zip(seen, seen[1:]))
            expected_calls = 1 if setting in ("auto", None) else -(-T // setting)
            assert len(seen) == expected_calls, (setting, seen)
    finally:
        dsv4.set_query_chunk("auto")
    with torch.no_grad():
        clean = dsv4(tokens)
    assert _relative(results[None], clean) > 1e-3
    for setting in ("auto", 16, 48):
        assert _relative(results[setting], results[None]) < 1e-4, setting


@pytest.mark.parametrize("hook_name", sorted(DSV4_EDITS))
def test_dsv4_prefill_and_steps_equal_one_forward_under_an_editing_hook(dsv4, hook_name):
    """The cache: a prefill, a one-token step, a longer step and a step that closes a CSA and an HCA
    window give, position by position, the one forward's logits under the same edit (1e-4 relative);
    `last_logits` (a prefill and a step on a fork) its last position. The hook fires once per call
    (twice per chunk-free call at most: the per-query points once per chunk), on that call's positions."""
    tokens = _prompts(dsv4, 3, 4)
    hooks = [(hook_name, DSV4_EDITS[hook_name])]
    cuts = (0, 50, 51, 90, 96, T)
    with torch.no_grad():
        clean = dsv4(tokens)
        whole = dsv4.run_with_hooks(tokens, fwd_hooks=hooks)
        cache = dsv4.init_cache()
        ranges = []
        with dsv4.hooks(fwd_hooks=hooks + [(hook_name, lambda t, hook: ranges.append(hook.ctx.get("query_range")))]):
            steps = torch.cat([dsv4(tokens[:, a:b], cache=cache) for a, b in zip(cuts, cuts[1:])], dim=1)
            last = dsv4.last_logits(tokens)
    assert _relative(whole, clean) > 1e-3, f"the edit at {hook_name} changes nothing: the test could not fail"
    assert _relative(steps, whole) < 1e-4, hook_name
    assert _relative(last, whole[:, -1]) < 1e-4, hook_name
    assert cache.length == T
    if "compressor" not in hook_name or "indexer" in hook_name:  # per-token and per-query points
        covered = sorted({r for r in ranges[: len(ranges) - 2] if r is not None})
        assert covered[0][0] == 0 and covered[-1][1] == T and all(x[1] == y[0] for x, y in zip(covered, covered[1:]))


def test_dsv4_chunks_are_a_function_of_length_and_model_never_of_batch(dsv4, monkeypatch):
    """Under "auto" above the chunking threshold (lowered here so dsv4-tiny's 256-token context
    reaches it), the ranges a per-query hook sees are the same for a batch of 1 and of 6: only one
    prompt row's cost sizes a chunk."""
    from phaseinterp.models.hf import chunking

    monkeypatch.setattr(chunking, "AUTO_CHUNK_ABOVE", 64)
    monkeypatch.setattr(chunking, "LONG_SCORE_BLOCK", 40_000)
    n = 200
    H, d = dsv4.cfg.n_heads, dsv4.cfg.d_head
    slots = dsv4.cfg.sliding_window + n // 4  # a pattern hook lays out every entry
    expected = chunking.chunk_ranges(n, max(H * (slots + 1), slots * d), "auto")
    assert len(expected) > 2
    seen = {}
    for batch in (1, 6):
        calls = []

        def record(pattern, hook, calls=calls):
            calls.append(hook.ctx["query_range"])

        tokens = torch.randint(0, dsv4.cfg.d_vocab, (batch, n), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            dsv4.run_with_hooks(tokens, return_type=None, fwd_hooks=[("blocks.0.attn.hook_pattern", record)])
        seen[batch] = calls
    assert seen[1] == seen[6] == expected


OWN_EDITS = {
    "blocks.0.attn.hook_pattern": zero_row_by_position,  # a cache call (last_logits' step) starts past 0
    "blocks.1.attn.hook_attn_scores": add_to_scores,
    "blocks.0.attn.hook_v": scale(0.5),
    "blocks.1.attn.hook_z": scale(1.5),
    "blocks.0.attn.compressor.hook_gate_k": one_hot_slot,
    "blocks.1.attn.compressor.hook_v_compressed": scale(2.0),
}


@pytest.fixture(scope="module")
def w4s4():
    return pi.load("w4s4")


@pytest.mark.parametrize("hook_name", sorted(OWN_EDITS))
def test_own_an_editing_hook_gives_the_same_logits_at_every_batch_size_and_in_last_logits(w4s4, hook_name):
    """The own family: the same prompts alone and inside batches of 64 and 512 give the same logits with
    the edit attached, and `last_logits` equals the full forward's last position under the same edit."""
    ours = torch.randint(0, w4s4.cfg.d_vocab, (4, T), generator=torch.Generator().manual_seed(0))
    fill = torch.randint(0, w4s4.cfg.d_vocab, (512 - 4, T), generator=torch.Generator().manual_seed(1))
    hooks = [(hook_name, OWN_EDITS[hook_name])]
    with torch.no_grad():
        clean = w4s4(ours)
        one = torch.cat([w4s4.run_with_hooks(ours[i:i + 1], fwd_hooks=hooks) for i in range(4)])
        mid = w4s4.run_with_hooks(torch.cat([ours, fill[:60]]), fwd_hooks=hooks)[:4]
        big = w4s4.run_with_hooks(torch.cat([ours, fill]), fwd_hooks=hooks)[:4]
        with w4s4.hooks(fwd_hooks=hooks):
            last = w4s4.last_logits(ours)
    assert _relative(one, clean) > 1e-3, f"the edit at {hook_name} changes nothing: the test could not fail"
    assert _relative(mid, one) < 1e-4 and _relative(big, one) < 1e-4
    assert _relative(last, one[:, -1]) < 1e-4


def test_dsv4_add_caching_hooks_joins_the_query_chunks_and_checks_names(dsv4):
    """``add_caching_hooks`` is ``run_with_cache``'s caching: a per-query point of a chunked forward is
    cached whole (it kept the last chunk), and a misspelt name is refused (it cached nothing)."""
    tokens = _prompts(dsv4, 1, 0)[:1, :64]
    name = "blocks.0.attn.hook_pattern"
    try:
        dsv4.set_query_chunk(16)
        _, want = dsv4.run_with_cache(tokens, names_filter=[name])
        cache = dsv4.add_caching_hooks([name])
        dsv4(tokens)
    finally:
        dsv4.reset_hooks()
        dsv4.set_query_chunk("auto")
    assert cache[name].shape == want[name].shape and cache[name].shape[2] == tokens.shape[1]
    torch.testing.assert_close(cache[name], want[name], rtol=0, atol=0)
    with pytest.raises(ValueError, match="hook_patern' is not a hook point"):
        dsv4.add_caching_hooks(["blocks.0.attn.hook_patern"])
    assert not any(point.has_hooks() for point in dsv4.hook_dict.values())


def test_pos_slice_is_refused_rather_than_slicing_another_axis(w4s4, dsv4):
    """TransformerLens's ``pos_slice`` picks the position axis by the hook's name; on these layouts it cut
    heads, slots or streams (18 of 50 cached activations on w4s4, 48 of 91 on dsv4-tiny). Refused, and
    ``pos_slice=None`` caches as before."""
    for model in (w4s4, dsv4):
        tokens = torch.randint(0, model.cfg.d_vocab, (1, 16), generator=torch.Generator().manual_seed(0))
        with pytest.raises(ValueError, match="pos_slice is refused here"):
            model.run_with_cache(tokens, pos_slice=-1)
        _, cache = model.run_with_cache(tokens, pos_slice=None)
        _, plain = model.run_with_cache(tokens)
        assert sorted(cache.keys()) == sorted(plain.keys()) and all(torch.equal(cache[k], plain[k]) for k in plain.keys())
        assert not any(point.has_hooks() for point in model.hook_dict.values())
