"""The own DeepSeek kernel (``compression="deepseek"``, W = 2S) against transformers'
``DeepseekV4CSACompressor`` on the same weights: the compression step (gated sum, kv_norm,
RoPE at the entry's position) agrees entry for entry, in both the vectorized model and the
reference (`phaseinterp.models.reference`).

Conventions that differ, mapped here rather than hidden (docs/models.md, "The own DeepSeek
kernel and transformers' CSA compressor"):

- Parameters: HF's ``kv_proj`` / ``gate_proj`` ``[2 * d_head, d_model]`` and ``position_bias``
  ``[S, 2 * d_head]`` hold two halves side by side; HF's first half (Ca, ``[:d_head]``) is the
  own kernel's ``half=0`` (the window's older S tokens), its second (Cb) ``half=1``.
- Channel order: HF rotates the trailing ``rope_dims`` channels as interleaved pairs
  ``(2i, 2i+1)``; the own model rotates the leading ``rope_dims`` channels as rotate-half pairs
  ``(i, rope_dims/2 + i)``. The same rotation on permuted channels: own channel ``c`` is HF
  channel ``perm[c]`` (RMS normalisation does not depend on channel order).
- Entry numbering: HF entry ``w`` mixes window ``w-1``'s Ca with window ``w``'s Cb and is
  rotated at ``w*S``; HF entry 0 has no Ca half (its slots are -inf) and no own counterpart.
  The own entry ``j`` (window offset 0) reads ``jS .. jS + 2S - 1`` and is rotated at
  ``jS + W - S = (j+1) S``: own entry ``j`` is HF entry ``j + 1``.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
from transformers import DeepseekV4Config  # noqa: E402
from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4CSACompressor  # noqa: E402

from phaseinterp import CompressedConfig, CompressedTransformer  # noqa: E402
from phaseinterp.models.reference import compressed_entry, rope  # noqa: E402

S, D_MODEL, D_HEAD, ROPE_DIMS, THETA, EPS, T = 4, 32, 16, 8, 160000.0, 1e-6, 32
CSA, HCA = "compressed_sparse_attention", "heavily_compressed_attention"


def own_to_hf_channels() -> torch.Tensor:
    """``perm[c]``: the HF channel holding own channel ``c`` (own [rotate-half rope | nope],
    HF [nope | interleaved rope])."""
    nope, half = D_HEAD - ROPE_DIMS, ROPE_DIMS // 2
    return torch.tensor([nope + 2 * i for i in range(half)] + [nope + 2 * i + 1 for i in range(half)]
                        + list(range(nope)))


def pair(seed: int = 0):
    """A random HF CSA compressor and an own one-layer DeepSeek-kernel model with its weights."""
    torch.manual_seed(seed)
    hf_cfg = DeepseekV4Config(
        hidden_size=D_MODEL, head_dim=D_HEAD, num_attention_heads=2, q_lora_rank=16, index_n_heads=2,
        index_head_dim=8, index_topk=3, compress_rates={CSA: S, HCA: 2 * S}, partial_rotary_factor=ROPE_DIMS / D_HEAD,
        rms_norm_eps=EPS, max_position_embeddings=1024, attn_implementation="eager",
        rope_parameters={"main": {"rope_type": "default", "rope_theta": 10000.0,
                                  "partial_rotary_factor": ROPE_DIMS / D_HEAD},
                         "compress": {"rope_type": "default", "rope_theta": THETA,
                                      "partial_rotary_factor": ROPE_DIMS / D_HEAD}},
    )
    hf = DeepseekV4CSACompressor(hf_cfg).eval()
    with torch.no_grad():
        for p in (hf.kv_proj.weight, hf.gate_proj.weight, hf.position_bias, hf.kv_norm.weight):
            p.copy_(torch.randn(p.shape))
        hf.kv_norm.weight.add_(1.0)
    own = CompressedTransformer(CompressedConfig(
        d_vocab=16, n_ctx=T, d_model=D_MODEL, n_layers=1, n_heads=2, n_kv_heads=1, d_head=D_HEAD, d_mlp=32,
        compression="deepseek", gate="vector", window=2 * S, stride=S, rope_dims=ROPE_DIMS, rope_base=THETA,
        norm_eps=EPS, local_window=4)).eval()
    perm = own_to_hf_channels()
    comp = own.blocks[0].attn.compressor
    with torch.no_grad():
        for half in range(2):
            rows = half * D_HEAD + perm
            comp.kv_proj[half, 0].copy_(hf.kv_proj.weight[rows])
            comp.gate_proj[half, 0].copy_(hf.gate_proj.weight[rows])
            comp.position_bias[:, half, 0].copy_(hf.position_bias[:, rows])
        comp.kv_norm_weight.copy_(hf.kv_norm.weight[perm])
    return hf, own, perm


def hf_entries(hf, x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """HF's compressed entries ``[entry, d_head]`` (kv_norm and RoPE applied), in the own channel order."""
    with torch.no_grad():
        entries, _ = hf(x[None], torch.randn(1, T, 16), torch.arange(T)[None], None, 0)
    return entries[0, 0][:, perm]


def test_own_deepseek_kernel_equals_hf_csa_compressor():
    hf, own, perm = pair()
    x = torch.randn(T, D_MODEL, generator=torch.Generator().manual_seed(1))
    expected = hf_entries(hf, x, perm)
    assert expected.shape == (T // S, D_HEAD)
    attn = own.blocks[0].attn
    cache = {}
    hook = lambda name: lambda t, hook: cache.__setitem__(name, t.detach())  # noqa: E731
    names = ["hook_rot_kv_compressed", "hook_normed_kv_compressed"]
    fwd_hooks = [(f"blocks.0.attn.compressor.{n}", hook(n)) for n in names]
    with torch.no_grad(), own.hooks(fwd_hooks=fwd_hooks):
        attn(x[None])
    n_own = T // S - 1  # own windows of width 2S closed by T tokens
    assert cache["hook_rot_kv_compressed"].shape == (1, n_own, 1, D_HEAD)
    torch.testing.assert_close(cache["hook_rot_kv_compressed"][0, :, 0], expected[1:], rtol=0, atol=1e-5)
    # the same entries in the readable specification, rotated where attention rotates them
    k_tok = torch.zeros(T, 1, D_HEAD)
    for j in range(n_own):
        kv, _ = compressed_entry(attn, x, k_tok, k_tok, j, 0)
        torch.testing.assert_close(kv, cache["hook_normed_kv_compressed"][0, j, 0], rtol=0, atol=1e-5)
        torch.testing.assert_close(rope(kv, (j + 1) * S, ROPE_DIMS, THETA), expected[j + 1], rtol=0, atol=1e-5)


def test_channel_map_matters():
    """The check can fail: without the channel permutation the entries differ."""
    hf, own, perm = pair(seed=2)
    x = torch.randn(T, D_MODEL, generator=torch.Generator().manual_seed(3))
    unpermuted = hf_entries(hf, x, torch.arange(D_HEAD))
    cache = {}
    with torch.no_grad(), own.hooks(fwd_hooks=[("blocks.0.attn.compressor.hook_rot_kv_compressed",
                                                lambda t, hook: cache.__setitem__("k", t.detach()))]):
        own.blocks[0].attn(x[None])
    assert (cache["k"][0, :, 0] - unpermuted[1:]).abs().max() > 1e-2
