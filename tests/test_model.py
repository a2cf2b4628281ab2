"""The core model: faithfulness to docs/science.md section 2, hooks, caches, checkpoints, errors."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import phaseinterp as pi
from phaseinterp import CheckpointError, CompressedConfig, CompressedTransformer
from phaseinterp.models.attention import CompressedAttention
from conftest import GATE_BIASES, make_model
from phaseinterp.models.reference import reference_attention

SMALL = dict(d_vocab=32, n_ctx=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_head=8, d_mlp=64, local_window=5)

# The layouts the paper sweeps, plus every kernel / gate / memory / position option.
NAMED_CONFIGS = {
    "W4S4": dict(window=4, stride=4),
    "W8S4": dict(window=8, stride=4),
    "W8S6": dict(window=8, stride=6),
    "W8S8": dict(window=8, stride=8),
    "W12S12": dict(window=12, stride=12),
    "vector": dict(window=4, stride=2, gate="vector"),
    "uniform": dict(window=3, stride=3, gate="uniform"),
    "no_bias_tied": dict(window=4, stride=4, gate_bias=False, tie_kv_gates=True),
    "shared_payload": dict(window=6, stride=3, payload="shared"),
    "deepseek_W8S4": dict(compression="deepseek", gate="vector", window=8, stride=4),
    "deepseek_W4S4": dict(compression="deepseek", gate="vector", window=4, stride=4),
    "tail": dict(window=4, stride=2, memory="uncompressed_tail"),
    "partial_rope": dict(window=4, stride=4, rope_dims=4),
    "no_rope": dict(window=4, stride=4, positional="none", qk_norm=False),
    "full": dict(compression=None),
}


def make(seed: int = 0, **overrides) -> CompressedTransformer:
    """Random, non-trivial gate biases and gate maps, so every gate path is exercised."""
    return make_model({**SMALL, **overrides, "seed": seed}, gate_seed=seed + 1,
                      randomize=GATE_BIASES + (".Z_", ".gate_proj"))


config_strategy = st.fixed_dictionaries(
    {
        "stride": st.integers(1, 5),
        "extra": st.integers(0, 5),
        "gate": st.sampled_from(["scalar", "vector", "uniform"]),
        "gate_bias": st.booleans(),
        "tie_kv_gates": st.booleans(),
        "payload": st.sampled_from(["per_slot", "shared"]),
        "memory": st.sampled_from(["local", "uncompressed_tail"]),
        "positional": st.sampled_from(["rope", "none"]),
        "qk_norm": st.booleans(),
        "kernel": st.sampled_from(["gated", "gated", "deepseek", None]),
        "seed": st.integers(0, 10_000),
    }
)


def config_from(d) -> dict:
    S = d["stride"]
    if d["kernel"] == "deepseek":
        return dict(compression="deepseek", gate="vector", window=S * (1 + d["extra"] % 2), stride=S,
                    memory=d["memory"], positional=d["positional"], qk_norm=d["qk_norm"])
    if d["kernel"] is None:
        return dict(compression=None, positional=d["positional"], qk_norm=d["qk_norm"])
    return dict(window=S + d["extra"], stride=S, gate=d["gate"], gate_bias=d["gate_bias"],
                tie_kv_gates=d["tie_kv_gates"], payload=d["payload"], memory=d["memory"],
                positional=d["positional"], qk_norm=d["qk_norm"])


def assert_causal(model, seed: int, t: int) -> None:
    """Changing tokens after position t leaves the logits up to t unchanged."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 32, (2, 32), generator=gen)
    changed = tokens.clone()
    changed[:, t + 1:] = torch.randint(0, 32, changed[:, t + 1:].shape, generator=gen)
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=1e-6)


# ----------------------------------------------------------------- causality
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=config_strategy, t=st.integers(0, 30))
def test_causality_property(d, t):
    assert_causal(make(d["seed"], **config_from(d)), d["seed"], t)


# ------------------------------------------------------- reference attention
@pytest.mark.parametrize("name", list(NAMED_CONFIGS))
def test_vectorized_attention_equals_reference(name):
    model = make(3, **NAMED_CONFIGS[name])
    tokens = torch.randint(0, 32, (1, 26), generator=torch.Generator().manual_seed(5))
    _, cache = model.run_with_cache(tokens)
    for layer in range(model.cfg.n_layers):
        x = cache[f"blocks.{layer}.ln1.hook_normalized"][0] * model.blocks[layer].ln1.w
        ref = reference_attention(model.blocks[layer].attn, x)
        torch.testing.assert_close(cache[f"blocks.{layer}.hook_attn_out"][0], ref, rtol=0, atol=1e-5)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=config_strategy)
def test_vectorized_attention_equals_reference_random_configs(d):
    model = make(d["seed"], **config_from(d))
    tokens = torch.randint(0, 32, (1, 18), generator=torch.Generator().manual_seed(d["seed"]))
    _, cache = model.run_with_cache(tokens)
    x = cache["blocks.1.ln1.hook_normalized"][0] * model.blocks[1].ln1.w
    ref = reference_attention(model.blocks[1].attn, x)
    torch.testing.assert_close(cache["blocks.1.hook_attn_out"][0], ref, rtol=0, atol=1e-5)


# ------------------------------------------------------ limiting cases
def _plain_causal_logits(model, tokens):
    """The model's own projections through torch's scaled_dot_product_attention."""
    cfg = model.cfg
    _, cache = model.run_with_cache(tokens)
    g = cfg.n_heads // cfg.n_kv_heads
    for layer in range(cfg.n_layers):
        q = cache[f"blocks.{layer}.attn.hook_rot_q"].transpose(1, 2)
        k = cache[f"blocks.{layer}.attn.hook_rot_k"].repeat_interleave(g, dim=2).transpose(1, 2)
        v = cache[f"blocks.{layer}.attn.hook_v"].repeat_interleave(g, dim=2).transpose(1, 2)
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_z"], z, rtol=0, atol=1e-5)


def test_full_attention_equals_plain_causal_attention():
    model = make(1, compression=None)
    _plain_causal_logits(model, torch.randint(0, 32, (2, 40)))


@pytest.mark.parametrize("payload", ["per_slot", "shared"])
def test_w1_s1_uncompressed_tail_equals_full_attention(payload):
    full = make(2, compression=None)
    comp = make(2, window=1, stride=1, memory="uncompressed_tail", payload=payload)
    state = {k: v for k, v in full.state_dict().items()}
    missing = comp.load_state_dict(state, strict=False)
    assert not missing.unexpected_keys
    if payload == "per_slot":
        with torch.no_grad():
            for block in comp.blocks:
                c = block.attn.compressor
                c.C_k.copy_(block.attn.W_K.transpose(1, 2)[None])
                c.C_v.copy_(block.attn.W_V.transpose(1, 2)[None])
    tokens = torch.randint(0, 32, (3, 48))
    with torch.no_grad():
        torch.testing.assert_close(comp(tokens), full(tokens), rtol=0, atol=1e-5)


# ------------------------------------------------------------ incremental
@pytest.mark.parametrize("name", ["W4S4", "W8S4", "W8S6", "deepseek_W8S4", "tail", "full", "shared_payload"])
def test_incremental_decoding_equals_full_forward(name):
    model = make(4, **NAMED_CONFIGS[name])
    tokens = torch.randint(0, 32, (2, 40))
    with torch.no_grad():
        full = model(tokens)
        cache = model.init_cache()
        steps = [model(tokens[:, t : t + 1], cache=cache) for t in range(40)]
        torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-5)
        cache = model.init_cache()  # uneven chunks, including one that closes several windows
        chunks = [model(tokens[:, a:b], cache=cache) for a, b in [(0, 7), (7, 8), (8, 21), (21, 40)]]
        torch.testing.assert_close(torch.cat(chunks, 1), full, rtol=0, atol=1e-5)
    assert cache.length == 40


def test_cache_clone_and_repeat_are_independent():
    model = make(0, window=4, stride=4)
    tokens = torch.randint(0, 32, (2, 20))
    with torch.no_grad():
        cache = model.init_cache()
        model(tokens[:, :19], cache=cache)
        twin = cache.clone()
        last = model(tokens[:, 19:], cache=cache)
        rep = twin.repeat_batch(3)
        last_rep = model(tokens[:, 19:].repeat_interleave(3, 0), cache=rep)
    torch.testing.assert_close(last_rep, last.repeat_interleave(3, 0), rtol=0, atol=1e-6)
    assert twin.length == 19 and cache.length == 20


# ------------------------------------------------------------------ hooks
def expected_hook_shapes(cfg: CompressedConfig, batch: int, T: int) -> dict[str, tuple]:
    H, KV, dh, dm = cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_model
    shapes = {"hook_embed": (batch, T, dm), "ln_final.hook_normalized": (batch, T, dm)}
    for layer in range(cfg.n_layers):
        b = f"blocks.{layer}"
        for name in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out"):
            shapes[f"{b}.{name}"] = (batch, T, dm)
        shapes[f"{b}.mlp.hook_post"] = (batch, T, cfg.d_mlp)
        shapes[f"{b}.attn.hook_q"] = (batch, T, H, dh)
        shapes[f"{b}.attn.hook_k"] = (batch, T, KV, dh)
        shapes[f"{b}.attn.hook_v"] = (batch, T, KV, dh)
        shapes[f"{b}.attn.hook_z"] = (batch, T, H, dh)
        if cfg.is_compressed:
            n_win = (T - cfg.window) // cfg.stride + 1
            band = cfg.local_window if cfg.memory == "local" else max(cfg.window - 1, cfg.stride - 1, 1)
            gate = (batch, n_win, cfg.window, KV) + ((dh,) if cfg.gate == "vector" or cfg.compression == "deepseek"
                                                     else ())
            entry = (batch, n_win, KV, dh)
            c = f"{b}.attn.compressor"
            shared = cfg.compression == "deepseek" or cfg.tie_kv_gates  # one gate feeds K and V
            for br in ("",) if shared else ("_k", "_v"):
                shapes[f"{c}.hook_gate_logits{br}"] = gate
                shapes[f"{c}.hook_gate{br}"] = gate
            if cfg.compression == "deepseek":  # K = V: one entry
                for name in ("hook_kv_compressed", "hook_normed_kv_compressed", "hook_rot_kv_compressed"):
                    shapes[f"{c}.{name}"] = entry
            else:
                for name in ("hook_k_compressed", "hook_v_compressed", "hook_rot_k_compressed"):
                    shapes[f"{c}.{name}"] = entry
            shapes[f"{b}.attn.hook_attn_scores"] = (batch, H, T, band + n_win)
            shapes[f"{b}.attn.hook_pattern"] = (batch, H, T, band + n_win)
        else:
            shapes[f"{b}.attn.hook_pattern"] = (batch, H, T, T)
    return shapes


@pytest.mark.parametrize("name", ["W4S4", "W8S6", "vector", "deepseek_W8S4", "tail", "full"])
def test_documented_hooks_have_documented_shapes(name):
    model = make(0, **NAMED_CONFIGS[name])
    _, cache = model.run_with_cache(torch.randint(0, 32, (2, 30)))
    for hook, shape in expected_hook_shapes(model.cfg, 2, 30).items():
        assert hook in cache.cache_dict, f"{hook} missing from run_with_cache"
        assert tuple(cache[hook].shape) == shape, f"{hook}: {tuple(cache[hook].shape)} != {shape}"
    pattern = cache["blocks.0.attn.hook_pattern"]
    torch.testing.assert_close(pattern.sum(-1), torch.ones(pattern.shape[:-1]))


def test_hook_result_on_request():
    model = make(0, use_attn_result=True)
    _, cache = model.run_with_cache(torch.randint(0, 32, (1, 12)))
    result = cache["blocks.0.attn.hook_result"]
    assert result.shape == (1, 12, 4, 32)
    torch.testing.assert_close(result.sum(2), cache["blocks.0.hook_attn_out"])


@pytest.mark.parametrize(
    "hook",
    ["blocks.0.attn.compressor.hook_gate_k", "blocks.0.attn.compressor.hook_v_compressed",
     "blocks.1.attn.hook_z", "blocks.0.attn.hook_k", "blocks.1.attn.hook_pattern"],
)
def test_run_with_hooks_replacement_changes_output(hook):
    model = make(0, window=4, stride=4)
    tokens = torch.randint(0, 32, (2, 30))
    clean = model(tokens)

    def scramble(act, hook):
        return act.flip(-1)

    patched = model.run_with_hooks(tokens, fwd_hooks=[(hook, scramble)])
    assert (patched - clean).abs().max() > 1e-4
    torch.testing.assert_close(model(tokens), clean, rtol=0, atol=0)  # hooks removed afterwards


def test_gate_hook_controls_compression():
    """Forcing alpha one-hot on slot 0 makes every compressed key the slot-0 payload."""
    model = make(0, window=4, stride=4, gate="scalar", payload="shared")

    def one_hot(alpha, hook):
        out = torch.zeros_like(alpha)
        out[:, :, 0] = 1.0
        return out

    tokens = torch.randint(0, 32, (1, 24))
    with model.hooks(fwd_hooks=[("blocks.0.attn.compressor.hook_gate_k", one_hot)]):
        _, cache = model.run_with_cache(tokens)
    k_tok = cache["blocks.0.attn.hook_k"][0]
    torch.testing.assert_close(cache["blocks.0.attn.compressor.hook_k_compressed"][0], k_tok[0::4])


def test_transformer_lens_patching_runs_unchanged():
    from transformer_lens import patching

    model = make(0, window=4, stride=4)
    clean = torch.randint(0, 32, (2, 16))
    corrupt = clean.clone()
    corrupt[:, 8:] = torch.randint(0, 32, (2, 8))
    _, clean_cache = model.run_with_cache(clean)

    def metric(logits):
        return logits[:, -1, 0].mean()

    out = patching.get_act_patch_resid_pre(model, corrupt, clean_cache, metric)
    assert out.shape == (2, 16)
    # Where clean and corrupt agree the patch is a no-op; patching the last position of
    # the last layer's input with the clean residual changes the metric.
    torch.testing.assert_close(out[:, :8], torch.full((2, 8), metric(model(corrupt)).item()), rtol=0, atol=1e-5)
    assert (out[1, -1] - metric(model(corrupt))).abs() > 1e-6
    heads = patching.get_act_patch_attn_head_out_all_pos(model, corrupt, clean_cache, metric)
    assert heads.shape == (2, 4)


def test_kv_head_groups_and_key_slot_sources():
    model = make(0, window=8, stride=4, n_heads=4, n_kv_heads=2)
    assert model.kv_head_groups() == {0: [0, 1], 1: [2, 3]}
    slots = model.key_slot_sources(0, query_pos=20)
    local = [s for s in slots if s[0] == "local"]
    assert [p for _, (p,) in local] == list(range(16, 21))
    entries = [pos for kind, pos in slots if kind == "entry"]
    assert entries == [list(range(j * 4, j * 4 + 8)) for j in range(4)]  # 3*4+7 = 19 <= 20 < 4*4+7
    tail = make(0, window=4, stride=2, memory="uncompressed_tail")
    kinds = tail.key_slot_sources(0, query_pos=9)  # window 3 (6..9) just closed: no tail
    assert [p for kind, p in kinds if kind == "local"] == []
    kinds = tail.key_slot_sources(0, query_pos=10)
    assert [p for kind, p in kinds if kind == "local"] == [[10]]


def test_gate_parameter_views():
    model = make(0, window=4, stride=4)
    gp = model.gate_parameters(1, "v")
    assert gp.Z.shape == (4, 2, 32) and gp.b.shape == (4, 2)
    assert gp.Z.data_ptr() == model.blocks[1].attn.compressor.Z_v.data_ptr()
    ds = make(0, compression="deepseek", gate="vector", window=8, stride=4)
    gp = ds.gate_parameters(0)
    assert gp.Z.shape == (8, 2, 8, 32) and gp.b.shape == (8, 2, 8)
    torch.testing.assert_close(gp.b[5], ds.blocks[0].attn.compressor.position_bias[1, 1])
    with pytest.raises(ValueError, match="layer=7 is out of range for a 2-layer model"):
        model.gate_parameters(7)


# ------------------------------------------------------------ checkpoints
def test_save_load_bit_identical(tmp_path):
    model = make(7, compression="deepseek", gate="vector", window=8, stride=4)
    tokens = torch.randint(0, 32, (2, 30))
    model.save_pretrained(tmp_path / "ckpt", metadata={"note": "x"})
    loaded = CompressedTransformer.from_pretrained(tmp_path / "ckpt")
    assert torch.equal(model(tokens), loaded(tokens))
    assert loaded.metadata["note"] == "x"
    assert loaded.cfg == model.cfg
    assert not list((tmp_path / "ckpt").glob("*.tmp"))


def test_truncated_checkpoint_raises(tmp_path):
    make(0).save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="truncated"):
        CompressedTransformer.from_pretrained(tmp_path)


def test_corrupt_checkpoint_raises(tmp_path):
    make(0).save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-5] ^= 0xFF
    weights.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="SHA-256"):
        CompressedTransformer.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{\"format\": 1, ")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        CompressedTransformer.from_pretrained(tmp_path)


def test_config_round_trip():
    cfg = CompressedConfig(window=12, stride=12, gate="vector", memory="uncompressed_tail")
    assert CompressedConfig.from_dict(json.loads(cfg.to_json())) == cfg
    with pytest.raises(ValueError, match="unknown CompressedConfig fields"):
        CompressedConfig.from_dict({"windw": 4})


# ------------------------------------------------------------ bad inputs
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(window=3, stride=4), "window=3 must be >= stride=4"),
        (dict(stride=0, window=4), "stride=0 must be an integer >= 1"),
        (dict(n_heads=4, n_kv_heads=3), "n_heads=4 must be divisible by n_kv_heads=3"),
        (dict(gate="softmax"), "gate='softmax' is not one of"),
        (dict(compression="lossy"), "compression='lossy' is not one of"),
        (dict(memory="all"), "memory='all' is not one of"),
        (dict(rope_dims=3), "rope_dims=3 must be an even integer in 2..16"),
        (dict(compression="deepseek", gate="vector", window=12, stride=4), "window=12 is not supported by the deepseek kernel"),
        (dict(compression="deepseek", gate="scalar"), "deepseek kernel always uses per-channel"),
        (dict(local_window=0), "local_window=0 must be an integer >= 1"),
        (dict(d_model=0), "d_model=0 must be an integer >= 1"),
    ],
)
def test_bad_configs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CompressedConfig(**kwargs)


def test_bad_tokens_raise():
    model = make(0)
    with pytest.raises(ValueError, match=r"token id 32 is outside the vocabulary \(valid ids: 0..31\)"):
        model(torch.tensor([[1, 2, 32]]))
    with pytest.raises(ValueError, match="token id -1"):
        model(torch.tensor([[-1, 2]]))
    with pytest.raises(ValueError, match=r"sequence length 65 exceeds n_ctx=64"):
        model(torch.zeros(1, 65, dtype=torch.long))
    # The model's own check, or the jaxtyping annotation when runtime checking is on.
    with pytest.raises(Exception, match=r"integer tensor|Int\[Tensor"):
        model(torch.zeros(1, 5))
    cache = model.init_cache()
    model(torch.zeros(1, 60, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="sequence length 65 exceeds"):
        model(torch.zeros(1, 5, dtype=torch.long), cache=cache)


def test_jaxtyping_runtime_checks_are_on():
    from phaseinterp.models.attention import apply_rope

    x = torch.zeros(1, 5, 2, 8)
    with pytest.raises(Exception, match="pos|shape|dim|type"):
        apply_rope(x, torch.zeros(6, 4), torch.zeros(5, 4), 8)


# ------------------------------------------------ staggered window grids
def staggered_from(d, offsets_seed: int, per_layer: bool) -> dict:
    """A random compressed config of `config_strategy` with random window offsets in 0..S-1
    (per KV head, or per layer and KV head)."""
    kw = config_from({**d, "kernel": d["kernel"] or "gated"})
    S = kw["stride"]
    gen = torch.Generator().manual_seed(offsets_seed)
    offsets = torch.randint(0, S, (SMALL["n_layers"], SMALL["n_kv_heads"]), generator=gen).tolist()
    kw["window_offsets"] = offsets if per_layer else offsets[0]
    return kw


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=config_strategy, offsets_seed=st.integers(0, 1000), per_layer=st.booleans(), t=st.integers(0, 30))
def test_causality_property_staggered(d, offsets_seed, per_layer, t):
    assert_causal(make(d["seed"], **staggered_from(d, offsets_seed, per_layer)), d["seed"], t)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=config_strategy, offsets_seed=st.integers(0, 1000), per_layer=st.booleans(),
       cuts=st.lists(st.integers(1, 35), min_size=0, max_size=5))
def test_incremental_decoding_staggered(d, offsets_seed, per_layer, cuts):
    """Pieces of any size (single tokens included) equal one full forward, and so does a step of
    the last token in three variants over a fork of the prefix's cache."""
    model = make(d["seed"], **staggered_from(d, offsets_seed, per_layer))
    tokens = torch.randint(0, 32, (2, 36), generator=torch.Generator().manual_seed(d["seed"]))
    bounds = [0, *sorted(set(cuts)), 36]
    with torch.no_grad():
        full = model(tokens)
        cache = model.init_cache()
        pieces = [model(tokens[:, a:b], cache=cache) for a, b in zip(bounds, bounds[1:])]
        torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=0, atol=1e-5)
        cache = model.init_cache()
        model(tokens[:, :-1], cache=cache)
        step = model(tokens[:, -1:].repeat_interleave(3, 0), cache=cache.fork(3))[:, 0]
        torch.testing.assert_close(step, full[:, -1].repeat_interleave(3, 0), rtol=0, atol=1e-5)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=config_strategy, offsets_seed=st.integers(0, 1000), per_layer=st.booleans())
def test_vectorized_attention_equals_reference_staggered(d, offsets_seed, per_layer):
    model = make(d["seed"], **staggered_from(d, offsets_seed, per_layer))
    tokens = torch.randint(0, 32, (1, 18), generator=torch.Generator().manual_seed(d["seed"]))
    _, cache = model.run_with_cache(tokens)
    for layer in range(model.cfg.n_layers):
        x = cache[f"blocks.{layer}.ln1.hook_normalized"][0] * model.blocks[layer].ln1.w
        ref = reference_attention(model.blocks[layer].attn, x)
        torch.testing.assert_close(cache[f"blocks.{layer}.hook_attn_out"][0], ref, rtol=0, atol=1e-5)


def test_window_offsets_config_shorthands_and_round_trip():
    cfg = CompressedConfig(**{**SMALL, "n_kv_heads": 4}, window=8, stride=8, window_offsets="staggered")
    assert [cfg.layer_window_offsets(layer) for layer in range(2)] == [(0, 2, 4, 6)] * 2
    one = CompressedConfig(**{**SMALL, "n_kv_heads": 1, "n_layers": 4}, window_offsets="staggered")
    assert [one.layer_window_offsets(layer) for layer in range(4)] == [(0,), (1,), (2,), (3,)]
    layers = CompressedConfig(**SMALL, window_offsets="staggered_layers")
    assert [layers.layer_window_offsets(layer) for layer in range(2)] == [(0, 0), (2, 2)]
    nested = CompressedConfig(**SMALL, window_offsets=[[1, 3], [0, 2]])
    assert nested.window_offsets == ((1, 3), (0, 2)) and nested.is_staggered and "staggered" in nested.label
    for c in (cfg, one, layers, nested):
        assert CompressedConfig.from_dict(json.loads(c.to_json())) == c
    assert not CompressedConfig(**SMALL).is_staggered
    assert CompressedConfig(**SMALL).layer_window_offsets(1) == (0, 0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(window_offsets=(0, 4)), r"window offset 4 is out of range 0..3 \(stride=4\)"),
        (dict(window_offsets=(0, -1)), r"window offset -1 is out of range 0..3"),
        (dict(window_offsets=(0, 1, 2)), r"has 3 entries; need one per KV head \(n_kv_heads=2\)"),
        (dict(window_offsets=((0, 1),)), r"1 per-layer rows; the model has n_layers=2"),
        (dict(window_offsets="diagonal"), r"window_offsets='diagonal' is not one of"),
        (dict(window_offsets=(0, 1.5)), r"window offset 1.5 is out of range"),
        (dict(window_offsets=3), r"window_offsets=3 must be None"),
        (dict(compression=None, window_offsets="staggered"), r"needs a compressed model"),
    ],
)
def test_bad_window_offsets_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CompressedConfig(**{**SMALL, **kwargs})


def test_per_head_boundaries_and_key_slot_sources():
    model = make(0, window=4, stride=4, window_offsets=(0, 2))
    assert model.window_offsets(0) == (0, 2) and model.boundary_phases(1) == (3, 1)
    assert make(0).boundary_phases(0) == (3, 3)
    # KV head 1's windows are 2..5, 6..9, ...: at query 9 it sees two entries, head 0 two (0..3, 4..7).
    head0 = [p for kind, p in model.key_slot_sources(0, 9, kv_head=0) if kind == "entry"]
    head1 = [p for kind, p in model.key_slot_sources(0, 9, kv_head=1) if kind == "entry"]
    assert head0 == [[0, 1, 2, 3], [4, 5, 6, 7]] and head1 == [[2, 3, 4, 5], [6, 7, 8, 9]]
    assert [p for kind, p in model.key_slot_sources(0, 8, kv_head=1) if kind == "entry"] == [[2, 3, 4, 5]]
    with pytest.raises(ValueError, match=r"kv_head=2 is out of range \(valid: 0..1\)"):
        model.key_slot_sources(0, 9, kv_head=2)
    with pytest.raises(ValueError, match="no compression windows"):
        make(0, compression=None).boundary_phases(0)


def test_staggered_entry_visibility_in_the_pattern():
    """Entry j of KV head h gets attention from query t only once j*S + o_h + W - 1 <= t."""
    model = make(1, window=4, stride=4, window_offsets=(0, 2))
    _, cache = model.run_with_cache(torch.randint(0, 32, (1, 30)))
    pattern = cache["blocks.0.attn.hook_pattern"][0]  # [head, query, slot]
    B = model.blocks[0].attn.band_width
    for head, o in ((0, 0), (2, 2)):  # query heads 0 (KV head 0) and 2 (KV head 1)
        for t in range(30):
            for j in range(pattern.shape[-1] - B):
                visible = j * 4 + o + 3 <= t
                assert (pattern[head, t, B + j] > 0) == visible, (head, t, j)


def test_staggered_memory_parity():
    """Every KV head keeps one entry per S tokens: the cache holds as many compressed entries
    as the shared grid's (a head whose windows start later closes its last one up to S-1
    tokens later)."""
    tokens = torch.randint(0, 32, (1, 64))
    entries = {}
    for offsets in (None, (0, 2), (1, 3)):
        model = make(0, window=4, stride=4, window_offsets=offsets)
        cache = model.init_cache()
        with torch.no_grad():
            model(tokens, cache=cache)
        entries[offsets] = [lc.k_comp.shape[1] for lc in cache.layers]
        assert all(lc.k_comp.shape == lc.v_comp.shape for lc in cache.layers)
    assert entries[None] == entries[(0, 2)] == [16, 16]  # windows 0..3, ..., 60..63
    assert entries[(1, 3)] == [15, 15]  # 1..4, ..., 57..60; 61..64 is not closed at length 64


# ------------------------------------------------- the last position alone, and the band without gathering
LAST_CONFIGS = {**NAMED_CONFIGS, "staggered": dict(window=4, stride=4, window_offsets="staggered"),
                "staggered_tail": dict(window=8, stride=4, window_offsets="staggered", memory="uncompressed_tail")}


@pytest.mark.parametrize("name", list(LAST_CONFIGS))
@pytest.mark.parametrize("length", [1, 3, 37, 64])
def test_last_logits_equal_the_full_forward(name, length):
    """`last_logits` (the last layer attends from the final position only) equals the full forward's
    last position, also with query chunks on; a sequence shorter than the band or a window too."""
    model = make(3, **LAST_CONFIGS[name])
    tokens = torch.randint(0, 32, (3, length), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        full = model(tokens)[:, -1]
        torch.testing.assert_close(model.last_logits(tokens), full, rtol=0, atol=1e-5)
        model.set_query_chunk(7)
        torch.testing.assert_close(model.last_logits(tokens), full, rtol=0, atol=1e-5)
        # and a wrong answer is caught: the second-to-last position's logits differ
        if length > 1:
            assert not torch.allclose(model(tokens)[:, -2], full, atol=1e-3)


def test_last_logits_is_a_prefill_and_one_step_under_any_hook():
    """`last_logits` is the cached forward, with or without hooks: a hook fires on the prefill (every
    position but the last; in the last layer only up to its cache, ``return_type="cache"``) and on the
    step (the last), ``hook.ctx["query_range"]`` saying which, and an edit written to that rule gives
    the hooked full forward's logits (docs/hooks.md, "The rule")."""
    model = make(0, window=4, stride=4)  # 2 layers: blocks.1 is the last
    tokens = torch.randint(0, 32, (2, 30), generator=torch.Generator().manual_seed(0))
    seen = []

    def scale(t, hook):
        seen.append((tuple(t.shape), hook.ctx["query_range"]))
        return 50 * t

    prefill_and_step, step_only = [(0, 29), (29, 30)], [(29, 30)]
    with torch.no_grad():
        for name, shape, calls in (("blocks.0.hook_resid_post", (2, 30, 32), prefill_and_step),
                                   ("blocks.0.attn.hook_z", (2, 30, 4, 8), prefill_and_step),
                                   ("blocks.1.attn.hook_k", (2, 30, 2, 8), prefill_and_step),
                                   ("blocks.1.attn.hook_z", (2, 30, 4, 8), step_only),
                                   ("blocks.1.attn.hook_pattern", None, step_only)):
            edited = model.run_with_hooks(tokens, fwd_hooks=[(name, scale)])[:, -1]
            seen.clear()
            with model.hooks(fwd_hooks=[(name, scale)]):
                got = model.last_logits(tokens)
            assert [r for _, r in seen] == calls, name
            if shape is not None:
                assert [s for s, _ in seen] == [(2, b - a) + shape[2:] for a, b in calls], name
            else:
                assert seen[-1][0][2] == 1
            torch.testing.assert_close(got, edited, rtol=1e-5, atol=1e-5)
        clean = model.last_logits(tokens)
        assert not torch.allclose(clean, edited, atol=1e-3)
        torch.testing.assert_close(clean, model(tokens)[:, -1], rtol=0, atol=1e-5)


def test_a_fork_reads_an_in_place_edit_of_the_cache_unless_frozen():
    """Two forks of one prefix, the cache's values edited in place between them: the second fork's step
    reads the edit (cross-model or activation patching of a cache), unless the cache was frozen first
    (`KVCache.freeze`: the caller declares no such edits, and the shared prefix is gathered once)."""
    model = make(0, window=4, stride=4)
    tokens = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for frozen in (False, True):
            cache = model.init_cache()
            model(tokens[:, :11], cache=cache, return_type=None)
            if frozen:
                cache.freeze()
            before = model(tokens[:, 11:], cache=cache.fork())
            for lc in cache.layers:
                lc.v.mul_(3.0)
                lc.v_comp.mul_(3.0)
            after = model(tokens[:, 11:], cache=cache.fork())
            assert torch.equal(before, after) == frozen


def test_freezing_a_copy_leaves_the_cache_it_was_copied_from_unfrozen():
    """`KVCache.copy` shares the layer caches; freezing the copy must not freeze the original, whose
    forks still read an in-place edit (a review found them reading the stale gather)."""
    model = make(0, window=4, stride=4)
    tokens = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = model.init_cache()
        model(tokens[:, :11], cache=cache, return_type=None)
        frozen = cache.copy().freeze()
        model(tokens[:, 11:], cache=frozen.fork())  # the frozen copy keeps its gather
        assert not any(lc.frozen for lc in cache.layers) and all(lc.frozen for lc in frozen.layers)
        before = model(tokens[:, 11:], cache=cache.fork())
        for lc in cache.layers:
            lc.v.mul_(3.0)
        after = model(tokens[:, 11:], cache=cache.fork())
        plain = model(tokens[:, 11:], cache=cache.copy())
        assert not torch.equal(before, after) and torch.allclose(after, plain, atol=1e-5)


def test_a_fork_takes_one_call_and_layers_are_checked():
    """A fork (`KVCache.fork`) is a view for one call, not extended; a second call, a batch that is
    not rows x variants, a cache of another model, layers out of range or a residual of the wrong
    shape are one line each."""
    model = make(0, window=4, stride=4)
    tokens = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = model.init_cache()
        model(tokens[:, :11], cache=cache, return_type=None)
        fork = cache.fork(2)
        model(tokens[:, 11:].repeat_interleave(2, 0), cache=fork)
        assert cache.length == 11 and all(lc.h.shape[:2] == (2, 11) for lc in cache.layers)
        with pytest.raises(ValueError, match="has taken its one call"):
            model(tokens[:, 11:].repeat_interleave(2, 0), cache=fork)
        with pytest.raises(ValueError, match=r"tokens batch 2 does not match the cache's batch 6 \(2 rows x 3 variants\)"):
            model(tokens[:, 11:], cache=cache.fork(3))
        with pytest.raises(ValueError, match="variants=0 must be an integer >= 1"):
            cache.fork(0)
        with pytest.raises(ValueError, match="is not a KVCache of this model's 2 layers"):
            model(tokens, cache=make(0, n_layers=3).init_cache())
        with pytest.raises(ValueError, match=r"start_at_layer=2 is out of range"):
            model(torch.zeros(2, 3, 32), start_at_layer=2)
        with pytest.raises(ValueError, match=r"stop_at_layer=0 "):
            model(tokens, stop_at_layer=0)
        with pytest.raises(ValueError, match=r"the residual stream \(start_at_layer's input\) must be a floating tensor \[batch, pos, 32\]"):
            model(tokens, start_at_layer=1)
        resid = model(tokens, stop_at_layer=1)
        torch.testing.assert_close(model(resid, start_at_layer=1), model(tokens), rtol=0, atol=0)
        half = model.init_cache()
        model(tokens, cache=half, stop_at_layer=1)
        with pytest.raises(ValueError, match=r"layers 0..1 hold different numbers of tokens \(\[0, 12\]\)"):
            model(tokens[:, :1], cache=half)


@pytest.mark.parametrize("name", list(LAST_CONFIGS))
@pytest.mark.parametrize("length", [1, 3, 37])
def test_a_hook_z_edit_by_the_rule_lands_in_last_logits(name, length):
    """A ``hook_z`` hook means in `last_logits` what it means in the full forward when it finds its
    position through ``hook.ctx["query_range"]``: an edit of the final position or of every position
    gives the hooked full forward's logits (to 1e-5; the step runs another kernel), and the edit lands."""
    model = make(3, **LAST_CONFIGS[name])
    tokens = torch.randint(0, 32, (3, length), generator=torch.Generator().manual_seed(length))

    def knock_last(z, hook):  # the final position's head 1 set to 0.5, wherever this call's positions are
        a, b = hook.ctx["query_range"]
        if not a <= length - 1 < b:
            return z
        z = z.clone()
        z[:, length - 1 - a, 1] = 0.5
        return z

    with torch.no_grad():
        full = model(tokens)[:, -1]
        for knock in (knock_last, lambda z, hook: 0.5 * z):
            reference = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_z", knock)])[:, -1]
            with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", knock)]):
                got = model.last_logits(tokens)
            torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-5)
            assert (got - full).abs().max() > 1e-4  # the edit landed


def test_a_hook_on_a_name_the_model_lacks_or_that_changes_a_shape_is_one_line():
    """Attaching a hook checks its name against the model's hook points (closest names in the
    message; a filter matching none is refused too), and a hook returning another shape is refused
    naming the point and both shapes (`paths.CheckedHooks`)."""
    model = make(0, window=4, stride=4)
    tokens = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"hook name 'blocks\.0\.hook_z' is not a hook point.*closest: blocks\.0\.attn\.hook_z"):
        with model.hooks(fwd_hooks=[("blocks.0.hook_z", lambda z, hook: z)]):
            pass
    with pytest.raises(ValueError, match="hook name 'blocks.7.hook_resid_post' is not a hook point"):
        model.add_hook("blocks.7.hook_resid_post", lambda z, hook: z)
    with pytest.raises(ValueError, match="the hook filter .* matches no hook point"):
        model.run_with_hooks(tokens, fwd_hooks=[(lambda name: name.endswith("hook_nothing"), lambda z, hook: z)])
    with pytest.raises(ValueError, match=r"the hook on blocks\.0\.hook_resid_post returned shape \(2, 3, 32\) "
                                         r"for an activation of shape \(2, 12, 32\)"):
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_post", lambda z, hook: z[:, :3])])
    for returned in ([1.0], True, np.zeros((2, 12, 32), dtype=np.float32)):  # failed deep, or (numpy) silently
        with pytest.raises(ValueError, match=rf"the hook on blocks\.0\.hook_resid_post returned a "
                                             rf"{type(returned).__name__}: a hook must return None or a tensor"):
            model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_post", lambda z, hook, r=returned: r)])
    assert not any(point.has_hooks() for point in model.hook_dict.values())  # nothing left attached


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_fused_full_attention_equals_the_slot_path(kv_heads, monkeypatch):
    """Full attention with idle score/pattern hooks runs torch's fused kernel (`_sdpa`); it
    equals the slot path the hooks see (a pattern hook attached) to 1e-5: one pass, query chunks,
    a cache grown in pieces and token by token. A broken mask (every key visible) is caught."""
    model = make(2, compression=None, n_kv_heads=kv_heads)
    tokens = torch.randint(0, 32, (3, 41), generator=torch.Generator().manual_seed(kv_heads))
    calls = []
    fused = CompressedAttention._sdpa
    monkeypatch.setattr(CompressedAttention, "_sdpa", lambda self, *a: calls.append(1) or fused(self, *a))
    with torch.no_grad():
        with model.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", lambda p, hook: p)
                                    for layer in range(model.cfg.n_layers)]):
            slots = model(tokens)
        assert not calls, "a pattern hook must see the slot path"
        torch.testing.assert_close(model(tokens), slots, rtol=0, atol=1e-5)
        assert len(calls) == model.cfg.n_layers
        torch.testing.assert_close(model.last_logits(tokens), slots[:, -1], rtol=0, atol=1e-5)
        model.set_query_chunk(6)
        torch.testing.assert_close(model(tokens), slots, rtol=0, atol=1e-5)
        model.set_query_chunk("auto")
        cache = model.init_cache()
        pieces = [model(tokens[:, a:b], cache=cache) for a, b in ((0, 17), (17, 18), (18, 41))]
        torch.testing.assert_close(torch.cat(pieces, 1), slots, rtol=0, atol=1e-5)
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                            lambda q, k, v, is_causal=False, attn_mask=None, scale=None: torch.softmax(
                                scale * q @ k.transpose(-1, -2), -1) @ v)
        assert not torch.allclose(model(tokens), slots, atol=1e-3)


@pytest.mark.zoo("w4s4", "deep12-w8s8-1kv-shared-equal")
@pytest.mark.parametrize("name", ["w4s4", "deep12-w8s8-1kv-shared-equal"])
def test_the_fused_path_differs_from_the_slot_path_by_float32_summation_order_only(name, monkeypatch, zoo_model):
    """The fused compressed attention is not bit-identical to the slot path in float32 (another summation
    order; 1e-5 relative on the 12-layer zoo model, benchmarks/RESULTS.md); in float64 the two agree to
    1e-12 relative on shipped checkpoints, so the float32 difference is rounding, not another computation."""
    model = copy.deepcopy(zoo_model(name)).double()
    tokens = pi.zoo.task_for(model).generate(72, seed=0).tokens[:8]
    with torch.no_grad():
        fused = model(tokens)
        with model.hooks(fwd_hooks=[(lambda n: n.endswith("hook_pattern"), lambda p, hook: p)]):  # the explicit softmax
            slots = model(tokens)
    assert (fused - slots).abs().max() <= 1e-12 * slots.abs().max()


@pytest.mark.parametrize("name", ["W4S4", "W8S4", "tail", "staggered", "staggered_tail"])
def test_fused_compressed_attention_equals_the_slot_path(name, monkeypatch):
    """Compressed attention with idle score/pattern hooks runs torch's fused kernel per block of
    queries (`_attend_sdpa`); it equals the slot path the hooks see (a pattern hook attached) to
    1e-5: one pass, blocks smaller than the prompt, a cache grown in pieces and token by token, and
    `last_logits`. A broken mask (every key visible) is caught."""
    import phaseinterp.models.attention as attention

    model = make(2, **LAST_CONFIGS[name])
    tokens = torch.randint(0, 32, (3, 61), generator=torch.Generator().manual_seed(7))
    calls = []
    fused = CompressedAttention._attend_sdpa
    monkeypatch.setattr(CompressedAttention, "_attend_sdpa", lambda self, *a: calls.append(1) or fused(self, *a))
    with torch.no_grad():
        with model.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", lambda p, hook: p)
                                    for layer in range(model.cfg.n_layers)]):
            slots = model(tokens)
        assert not calls, "a pattern hook must see the slot path"
        torch.testing.assert_close(model(tokens), slots, rtol=0, atol=1e-5)
        assert len(calls) == model.cfg.n_layers
        monkeypatch.setattr(attention, "FUSED_BLOCK", 16)  # several blocks, the last one short
        torch.testing.assert_close(model(tokens), slots, rtol=0, atol=1e-5)
        torch.testing.assert_close(model.last_logits(tokens), slots[:, -1], rtol=0, atol=1e-5)
        cache = model.init_cache()
        pieces = [model(tokens[:, a:b], cache=cache) for a, b in ((0, 17), (17, 18), (18, 19), (19, 61))]
        torch.testing.assert_close(torch.cat(pieces, 1), slots, rtol=0, atol=1e-5)
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                            lambda q, k, v, attn_mask=None, scale=None: torch.softmax(
                                scale * q @ k.transpose(-1, -2), -1) @ v)
        assert not torch.allclose(model(tokens), slots, atol=1e-3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 40), width=st.integers(1, 9), block=st.integers(1, 20), p0=st.integers(0, 30),
       extra=st.integers(0, 5), kv=st.integers(1, 2), g=st.integers(1, 3))
def test_block_band_equals_gathering_every_query_s_keys(n, width, block, p0, extra, kv, g):
    """`BlockBand` (one dense matmul per query block, the band as its skewed diagonal) gives the
    same band scores and the same pattern-weighted values as gathering each query's band keys."""
    from phaseinterp.models.attention import BlockBand, GatheredBand

    gen = torch.Generator().manual_seed(n * 1000 + width * 10 + block)
    P, d = p0 + n + extra, 4  # the cache may hold positions past the queries
    k, v = torch.randn(2, P, kv, d, generator=gen), torch.randn(2, P, kv, d, generator=gen)
    band = p0 + torch.arange(n)[:, None] - width + 1 + torch.arange(width)
    valid = (band >= 0)[None, None, None, :, :]
    gathered = GatheredBand(k[:, band.clamp(min=0)], v[:, band.clamp(min=0)])
    blocked = BlockBand(k, v, p0, n, width, block=max(block, width))
    qg = torch.randn(2, n, kv, g, d, generator=gen)
    torch.testing.assert_close(blocked.scores(qg).masked_fill(~valid, 0), gathered.scores(qg).masked_fill(~valid, 0),
                               rtol=0, atol=1e-5)
    p = torch.rand(2, kv, g, n, width, generator=gen).masked_fill(~valid, 0)
    torch.testing.assert_close(blocked.mix(p), gathered.mix(p), rtol=0, atol=1e-5)


def test_mlp_row_blocks_are_bit_identical_to_the_whole_batch():
    """`SwiGLU` runs its rows in blocks of `MLP_ROWS` while its hooks are idle: the same numbers, bit
    for bit, as the one-shot path a hook sees (and the hooks still see the whole batch)."""
    from phaseinterp.models.transformer import MLP_ROWS

    model = make(0, window=4, stride=4)
    mlp = model.blocks[0].mlp
    x = torch.randn(3, MLP_ROWS // 2 + 7, 32, generator=torch.Generator().manual_seed(0))  # 1.5 blocks + a rest
    seen = []
    with torch.no_grad():
        blocked = mlp(x)
        with model.hooks(fwd_hooks=[("blocks.0.mlp.hook_post", lambda t, hook: seen.append(t.shape))]):
            whole = mlp(x)
    assert seen == [torch.Size([3, MLP_ROWS // 2 + 7, 64])]
    assert torch.equal(blocked, whole)


# ------------------------------------------------------------ the allocator
_FAULTS = """
import ctypes, importlib.util, resource, sys
spec = importlib.util.spec_from_file_location("allocator", sys.argv[1])  # without the package (no torch)
allocator = importlib.util.module_from_spec(spec)
spec.loader.exec_module(allocator)
applied = allocator.keep_freed_memory() if sys.argv[2] == "kept" else False
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = 40 << 20  # above glibc's largest dynamic mmap threshold (32 MiB)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):  # what a forward does with an intermediate, layer after layer
    p = libc.malloc(size)
    ctypes.memset(p, 1, size)
    libc.free(p)
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.slow  # starts two processes
@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="glibc's allocator")
def test_keep_freed_memory_stops_the_page_faults_of_freed_blocks(monkeypatch):
    """Under glibc's defaults a 40 MiB block freed and allocated again is faulted in anew every time;
    after `keep_freed_memory` only the first allocation faults. Elsewhere the call does nothing."""
    import os
    import subprocess
    import sys

    from phaseinterp.models import allocator

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    pages = (40 << 20) // os.sysconf("SC_PAGE_SIZE")
    out = {}
    for setting in ("default", "kept"):
        run = subprocess.run([sys.executable, "-c", _FAULTS, allocator.__file__, setting], env=env,
                             capture_output=True, text=True, check=True)
        applied, faults = run.stdout.split()
        out[setting] = (applied, int(faults))
    assert out["default"][1] >= 9 * pages, out  # every round faults the whole block in
    assert out["kept"] == ("True", out["kept"][1]) and out["kept"][1] <= 2 * pages, out
    assert allocator.keep_freed_memory() is True  # idempotent (conftest called it already)
    monkeypatch.setattr(allocator, "_applied", False)
    monkeypatch.setattr(sys, "platform", "darwin")
    assert allocator.keep_freed_memory() is False
