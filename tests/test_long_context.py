"""Long prompts: attention queries in chunks equal the one-shot path, hooks keep their shapes,
and a last-position ablation over a long prefix is one prefix pass plus the last position."""

from __future__ import annotations

import pytest
import torch

from conftest import GATE_BIASES, make_model, small_task
from phaseinterp.models import attention
from phaseinterp.models.attention import CompressedAttention

pytestmark = pytest.mark.usefixtures("one_thread")


SMALL = dict(d_vocab=32, n_ctx=96, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_head=8, d_mlp=64,
             local_window=5)
CONFIGS = {
    "W4S4": dict(window=4, stride=4),
    "W8S4": dict(window=8, stride=4),
    "W8S6_vector": dict(window=8, stride=6, gate="vector"),
    "deepseek_W8S4": dict(compression="deepseek", gate="vector", window=8, stride=4),
    "deepseek_W4S4": dict(compression="deepseek", gate="vector", window=4, stride=4),
    "tail": dict(window=4, stride=2, memory="uncompressed_tail"),
    "staggered": dict(window=4, stride=4, window_offsets="staggered"),
    "staggered_W8S4": dict(window=8, stride=4, window_offsets="staggered", memory="uncompressed_tail"),
    "full": dict(compression=None),
}


def make(name: str, seed: int = 0, **overrides):
    return make_model({**SMALL, **CONFIGS[name], "seed": seed, **overrides}, gate_seed=seed + 1,
                      randomize=GATE_BIASES + (".Z_", ".gate_proj"))


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("chunk", [1, 7, 16])
def test_chunked_attention_equals_one_shot(name, chunk):
    model = make(name)
    tokens = torch.randint(0, 32, (2, 90))
    with torch.no_grad():
        reference = model(tokens)
        model.set_query_chunk(chunk)
        assert model.query_chunk == chunk
        torch.testing.assert_close(model(tokens), reference, rtol=0, atol=1e-5)
        cache = model.init_cache()  # the incremental path: a chunked prefix, then chunked continuations
        pieces = [model(tokens[:, a:b], cache=cache) for a, b in [(0, 41), (41, 42), (42, 90)]]
        torch.testing.assert_close(torch.cat(pieces, 1), reference, rtol=0, atol=1e-5)
    model.set_query_chunk(None)
    assert model.query_chunk is None


def test_chunks_see_only_the_keys_they_need(monkeypatch):
    """A query chunk never builds a [T, key_slot] score matrix: each kernel call gets at most
    ``chunk`` queries and, as keys, only its band tokens and the entries visible to its last query."""
    model = make("W4S4").set_query_chunk(8)
    group = model.cfg.n_heads // model.cfg.n_kv_heads
    seen = []
    sdpa = attention.F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, scale=None):
        seen.append((q.shape[2] // group, k.shape[2]))
        return sdpa(q, k, v, attn_mask=attn_mask, scale=scale)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    with torch.no_grad():
        model(torch.randint(0, 32, (1, 90)))
    per_layer = [8] * 11 + [2]
    assert [s[0] for s in seen] == per_layer * model.cfg.n_layers
    B = model.blocks[0].attn.band_width
    for i, (n_q, n_k) in enumerate(seen[:len(per_layer)]):
        a = 8 * i
        last = a + n_q - 1
        assert n_k == (last + 1 - max(0, a - B + 1)) + attention.n_visible_entries(last, 4, 4, 0)


def test_fused_blocks_see_only_their_bands_and_visible_entries(monkeypatch):
    """The fused compressed attention never builds a [T, T] mask: each kernel call gets a block of
    at most FUSED_BLOCK queries and, as keys, the block's band tokens and the entries visible to its
    last query, so its memory grows linearly in T."""
    model = make("W4S4")
    seen = []
    sdpa = attention.F.scaled_dot_product_attention

    group = model.cfg.n_heads // model.cfg.n_kv_heads  # a KV head's query heads stacked along the query axis

    def spy(q, k, v, attn_mask=None, scale=None):
        assert q.shape[1] == k.shape[1] == model.cfg.n_kv_heads  # K and V are not copied per query head
        seen.append((q.shape[2] // group, k.shape[2]))
        return sdpa(q, k, v, attn_mask=attn_mask, scale=scale)

    monkeypatch.setattr(attention, "FUSED_BLOCK", 16)
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    T = 90
    with torch.no_grad():
        fused = model(torch.randint(0, 32, (1, T), generator=torch.Generator().manual_seed(0)))
    with torch.no_grad(), model.hooks(fwd_hooks=[(lambda n: n.endswith("hook_pattern"), lambda p, hook: p)]):
        slot = model(torch.randint(0, 32, (1, T), generator=torch.Generator().manual_seed(0)))  # the explicit softmax
    torch.testing.assert_close(fused, slot, rtol=0, atol=1e-5)
    B = model.blocks[0].attn.band_width
    per_layer = [16] * 5 + [10]
    assert [s[0] for s in seen] == per_layer * model.cfg.n_layers
    for i, (n_q, n_k) in enumerate(seen):
        a = 16 * (i % len(per_layer))
        last = a + n_q - 1
        assert n_k == (last + 1 - max(0, a - B + 1)) + attention.n_visible_entries(last, 4, 4, 0)
        assert n_k <= B + 16 + T // 4


@pytest.mark.parametrize("name", ["W8S4", "deepseek_W8S4", "full"])
def test_hooks_keep_full_shapes_and_values_when_chunked(name):
    model = make(name)
    tokens = torch.randint(0, 32, (2, 60))
    with torch.no_grad():
        logits, ref = model.run_with_cache(tokens)
        model.set_query_chunk(8)
        chunked_logits, cache = model.run_with_cache(tokens)
        torch.testing.assert_close(chunked_logits, logits, rtol=0, atol=1e-5)
        assert set(cache.cache_dict) == set(ref.cache_dict)
        for hook, value in ref.cache_dict.items():
            assert cache[hook].shape == value.shape, hook
            torch.testing.assert_close(cache[hook], value, rtol=0, atol=1e-5, msg=hook)
        # hooks that do not read the scores leave the chunked path on, with full shapes
        names = lambda n: n.endswith(("hook_z", "hook_q", "hook_resid_post"))  # noqa: E731
        chunked_logits, cache = model.run_with_cache(tokens, names_filter=names)
        torch.testing.assert_close(chunked_logits, logits, rtol=0, atol=1e-5)
        for hook, value in cache.cache_dict.items():
            torch.testing.assert_close(value, ref[hook], rtol=0, atol=1e-5, msg=hook)


def test_hook_edits_act_on_the_chunked_run():
    model = make("W8S4")
    tokens = torch.randint(0, 32, (2, 60))

    def zero_head(z, hook):
        z = z.clone()
        z[:, 30:, 1] = 0
        return z

    def flatten_pattern(pattern, hook):
        return torch.where(pattern > 0, 1.0, 0.0) / (pattern > 0).sum(-1, keepdim=True)

    with torch.no_grad():
        hooks = [("blocks.0.attn.hook_z", zero_head), ("blocks.1.attn.hook_pattern", flatten_pattern)]
        reference = model.run_with_hooks(tokens, fwd_hooks=hooks)
        model.set_query_chunk(8)
        edited = model.run_with_hooks(tokens, fwd_hooks=hooks)
        torch.testing.assert_close(edited, reference, rtol=0, atol=1e-5)
        assert not torch.allclose(edited, model(tokens), atol=1e-4)  # the edits did something


@pytest.mark.parametrize("value", [0, -3, 2.5, True, "8"])
def test_bad_query_chunk_raises(value):
    model = make("W4S4")
    with pytest.raises(ValueError, match=r"query_chunk=.* must be 'auto', None \(no chunking\) or an integer >= 1"):
        model.set_query_chunk(value)


def test_the_ablation_sweep_is_one_prefill_then_steps_over_forks(monkeypatch):
    """`ablate`'s sweep is the cached forward: per prompt batch (calibration prompts too) one prefill of
    the prefix (``answer_pos`` tokens) through every layer, one step of the answer position over a fork (every layer), then per
    layer ``L`` one step from ``L`` on of its V units as V variants of a fork; the prefix is never run
    twice. With query chunks it equals the unchunked sweep."""
    from phaseinterp.interventions import ablate

    task = small_task()
    model = make("W4S4", d_vocab=task.vocab.size)
    prompts = task.generate(2, seed=0, strict=False)
    answer_pos = int(prompts.answer_pos[0])
    reference = ablate(model, task, prompts=prompts, n_calibration=8, batch_size=4, progress=False)
    model.set_query_chunk(8)
    calls = []
    forward = CompressedAttention.forward

    def spy(self, x, cache=None, start=0, variants=None, cache_only=False):
        calls.append((self.layer, x.shape[1], start, variants, cache_only))
        return forward(self, x, cache, start, variants, cache_only)

    monkeypatch.setattr(CompressedAttention, "forward", spy)
    chunked = ablate(model, task, prompts=prompts, n_calibration=8, batch_size=4, progress=False)
    assert (chunked.clean_correct == reference.clean_correct).all()
    assert (chunked.knockout_correct == reference.knockout_correct).all()
    torch.testing.assert_close(torch.as_tensor(chunked.knockout_logit_answer),
                               torch.as_tensor(reference.knockout_logit_answer), rtol=0, atol=1e-5)
    L, V = model.cfg.n_layers, model.cfg.n_kv_heads
    n_batches = -(-len(prompts) // 4)
    # a prefill (the last layer's cache only: return_type="cache"), then the answer position's step
    prefill_and_step = ([(layer, answer_pos, 0, None, layer == L - 1) for layer in range(L)]
                        + [(layer, 1, answer_pos, 1, False) for layer in range(L)])
    calibration = prefill_and_step * 2  # 8 prompts in batches of 4
    per_batch = prefill_and_step + [(later, 1, answer_pos, V, False) for layer in range(L) for later in range(layer, L)]
    assert calls == calibration + per_batch * n_batches
    assert len(reference.units) == V * L


@pytest.mark.parametrize("name", ["W8S4", "staggered_W8S4", "full"])
def test_auto_chunks_long_inputs_and_equals_one_shot(name, monkeypatch):
    """The default ("auto") runs queries in blocks covering every query once, with the outputs of
    the one-shot path. Full attention: one pass up to AUTO_CHUNK_ABOVE new tokens, above it blocks
    whose score block fits SCORE_BLOCK. Compressed attention: blocks of at most FUSED_BLOCK queries
    within ``4 * SCORE_BLOCK`` per prompt row at any length."""
    from phaseinterp.models import attention

    monkeypatch.setattr(attention, "AUTO_CHUNK_ABOVE", 64)
    monkeypatch.setattr(attention, "SCORE_BLOCK", 4 * 24 * 20)  # 4 heads per prompt row: a few dozen queries
    model = make(name, n_ctx=200)
    assert model.query_chunk == "auto"
    attn = model.blocks[0].attn
    ranges = attn.query_ranges(0, 200)
    assert ranges[0][0] == 0 and ranges[-1][1] == 200 and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    sizes = [b - a for a, b in ranges]
    assert len(ranges) > 3 and sizes[0] >= sizes[-2]  # no more queries per block as the visible keys grow
    if model.cfg.is_compressed:
        assert attn.query_ranges(0, 64) == attn._fused_blocks(0, 64)
        assert all(16 <= size <= attention.FUSED_BLOCK for size in sizes[:-1])
    else:
        assert attn.query_ranges(0, 64) is None
        assert sizes[0] > sizes[-2]
        for a, b in ranges:
            assert b - a <= attention.MIN_AUTO_CHUNK or 4 * (b - a) * attn.n_key_slots(b - 1) <= attention.SCORE_BLOCK
    tokens = torch.randint(0, 32, (2, 200))
    with torch.no_grad():
        auto = model(tokens)
        reference = model.set_query_chunk(None)(tokens)
    torch.testing.assert_close(auto, reference, rtol=0, atol=1e-5)
    assert attn.query_ranges(0, 200) is None  # None: off, whatever the length
