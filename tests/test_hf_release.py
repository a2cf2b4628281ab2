"""Real-checkpoint paths for DeepSeek-V4 (issue 23): DeepSeek's released layout, FP8, offloading.

The shipped ``dsv4-tiny`` exported with ``phaseinterp zoo export`` is the fixture: it goes through
`load_hf` and transformers' own conversion exactly as a downloaded checkpoint would. ``dsv4-tiny-fp8``
(the same recipe trained FP8-native, as a real release is) is the fixture for FP8: its FP8 export must
load back bit for bit.
"""

import json
import shutil

import numpy as np
import pytest
import torch

import phaseinterp as pi
from phaseinterp._checks import parse_size
from phaseinterp.models.hf.export import (
    export_release,
    fp8_parameter_parts,
    fp8_roundtrip,
    fp8_roundtrip_parts,
    quantize_fp8_blocks,
)
from phaseinterp.models.hf.memory import config_from_dict
from phaseinterp.models.hf.release_layout import INDEX_FILE, check_names_roundtrip, release_tensors

pytestmark = pytest.mark.zoo("dsv4-tiny")
N = 72  # prompts per residue: the smallest moment-matched size for the zoo task
FP8_NATIVE = "dsv4-tiny-fp8"  # dsv4-tiny's recipe trained FP8-native (fp8_weights=True)


@pytest.fixture(scope="module")
def shipped(zoo_model):
    return zoo_model("dsv4-tiny")  # the test run's shared copy (conftest); export and offloading read it only


@pytest.fixture(scope="module")
def exported(shipped, tmp_path_factory):
    root = tmp_path_factory.mktemp("release")
    export_release(shipped, root / "fp32", experts="float")  # unquantized experts: loads back bit for bit
    export_release(shipped, root / "fp8", fp8=True, experts="fp8")
    export_release(shipped, root / "fp4")  # the default: MXFP4 experts, as released
    export_release(shipped, root / "release", fp8=True)  # FP8 dense + MXFP4 experts: DeepSeek-V4's release format
    return root


@pytest.fixture(scope="module")
def shipped_profile(zoo_profile):
    return zoo_profile("dsv4-tiny", N)  # measured once per test run (conftest), shared with test_deepseek_v4


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------------ layout
def test_release_names_are_deepseeks_and_transformers_maps_them_back(shipped, exported):
    names = json.loads((exported / "fp32" / INDEX_FILE).read_text())["weight_map"]
    for name in ("embed.weight", "head.weight", "norm.weight", "hc_head_fn", "layers.0.attn.wq_a.weight",
                 "layers.0.attn.wkv.weight", "layers.0.attn.attn_sink", "layers.0.attn.compressor.ape",
                 "layers.0.attn.compressor.wgate.weight", "layers.0.attn.indexer.compressor.ape",
                 "layers.0.attn.indexer.wq_b.weight", "layers.0.attn.indexer.weights_proj.weight",
                 "layers.0.ffn.gate.bias", "layers.0.ffn.experts.1.w3.weight", "layers.2.ffn.shared_experts.w2.weight",
                 "layers.1.hc_attn_fn", "layers.1.attn_norm.weight", "layers.1.ffn_norm.weight",
                 "layers.0.attn.kv_norm.weight", "layers.0.attn.compressor.norm.weight",
                 "layers.0.attn.indexer.compressor.norm.weight"):
        assert name in names, name
    assert "layers.0.attn.norm.weight" not in names  # the release (and llama.cpp's converter) name it kv_norm
    assert not any(n.startswith("model.") or "self_attn" in n or "gate_up_proj" in n for n in names)
    assert len(set(names.values())) > 1  # sharded
    check_names_roundtrip(list(names), shipped.hf.config)  # raises if any name misses
    with pytest.raises(RuntimeError, match="no parameter"):
        check_names_roundtrip(["layers.0.attn.not_a_weight"], shipped.hf.config)


def test_full_precision_export_loads_bit_identical(shipped, exported):
    model = pi.load_hf(exported / "fp32")
    assert model.metadata["checkpoint"]["layout"] == "deepseek" and not model.metadata["checkpoint"]["fp8"]
    ref = shipped.hf.state_dict()
    got = model.hf.state_dict()
    assert set(got) == set(ref)
    assert all(torch.equal(got[k], ref[k]) for k in ref)
    assert model.metadata["task"] == shipped.metadata["task"]  # the sidecar travels


def test_release_config_folds_back_to_the_shipped_config(shipped, exported):
    raw = json.loads((exported / "fp8" / "config.json").read_text())
    assert raw["quantization_config"] == {"quant_method": "fp8", "activation_scheme": "dynamic",
                                          "weight_block_size": [128, 128], "scale_fmt": "ue8m0"}
    assert raw["expert_dtype"] == "fp8" and raw["compress_rate_csa"] == 4 and raw["compress_rate_hca"] == 32
    assert "compress_rates" not in raw and raw["num_hash_layers"] == 0
    assert raw["compress_ratios"] == [4, 4, 32]  # one per layer (CSA, CSA, HCA), as the release's config
    back = config_from_dict(raw).to_dict()
    want = shipped.hf.config.to_dict()
    for key in ("compress_rates", "layer_types", "mlp_layer_types", "rope_parameters", "partial_rotary_factor",
                "hidden_size", "num_hidden_layers", "index_topk", "sliding_window", "n_routed_experts"):
        assert back[key] == want[key], key


def test_fp8_where_transformers_quantizes_and_scales_beside(exported):
    from safetensors import safe_open

    folder = exported / "fp8"
    weight_map = json.loads((folder / INDEX_FILE).read_text())["weight_map"]
    dtypes = {}
    for shard in set(weight_map.values()):
        with safe_open(folder / shard, "pt") as f:
            dtypes.update({k: f.get_slice(k).get_dtype() for k in f.keys()})
    fp8 = {k for k, d in dtypes.items() if d == "F8_E4M3"}
    assert "layers.0.attn.wq_a.weight" in fp8 and "layers.0.ffn.experts.0.w1.weight" in fp8
    assert "layers.0.attn.indexer.wq_b.weight" in fp8
    # DeepSeek ships these in BF16 (transformers' _keep_in_fp32_modules); lm_head and embeddings too
    for name in ("layers.0.attn.compressor.wkv.weight", "layers.0.attn.compressor.wgate.weight",
                 "layers.0.attn.indexer.compressor.wkv.weight", "layers.0.attn.indexer.weights_proj.weight",
                 "head.weight", "embed.weight", "layers.0.ffn.gate.weight"):
        assert name not in fp8, name
    for name in fp8:
        assert dtypes[name.removesuffix(".weight") + ".scale"] == "F32"


def test_fp8_blocks_round_trip_within_e4m3_precision():
    w = torch.randn(256, 384) * torch.logspace(-3, 0, 384)
    q, scale = quantize_fp8_blocks(w)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (2, 3)
    assert torch.equal(torch.log2(scale), torch.log2(scale).round())  # UE8M0: powers of two
    back = q.float().reshape(2, 128, 3, 128) * scale[:, None, :, None]
    rel = (back.reshape(256, 384) - w).abs() / w.abs().clamp_min(1e-12)
    big = w.abs() > scale.repeat_interleave(128, 0).repeat_interleave(128, 1) * 2 ** -6  # normal range of e4m3
    assert rel[big].max() <= 2 ** -4 + 1e-6  # half an ulp of a 3-bit mantissa
    with pytest.raises(ValueError, match="rows=200"):
        quantize_fp8_blocks(torch.randn(200, 64))


def test_fp8_exact_scales_put_each_block_maximum_on_448():
    w = torch.randn(256, 384) * torch.logspace(-3, 0, 384)
    q, scale = quantize_fp8_blocks(w, scales="exact")
    amax = w.reshape(2, 128, 3, 128).abs().amax(dim=(1, 3))
    assert scale.dtype == torch.float32 and torch.equal(scale, amax / 448.0)
    assert not torch.equal(torch.log2(scale), torch.log2(scale).round())  # not UE8M0
    assert torch.equal(q.float().reshape(2, 128, 3, 128).abs().amax(dim=(1, 3)), torch.full((2, 3), 448.0))
    back = q.float().reshape(2, 128, 3, 128) * scale[:, None, :, None]
    rel = (back.reshape(256, 384) - w).abs() / w.abs().clamp_min(1e-12)
    big = w.abs() > scale.repeat_interleave(128, 0).repeat_interleave(128, 1) * 2 ** -6
    assert rel[big].max() <= 2 ** -4 + 1e-6
    with pytest.raises(ValueError, match="scales='ue8m0' is not a scale format"):
        quantize_fp8_blocks(w, scales="ue8m0")


def test_fp8_exact_export_loads_through_transformers_float_scales(shipped, tmp_path):
    """``fp8_scales="exact"`` writes ``scale_fmt="float"`` and float32 ``max|w| / 448`` scales;
    transformers dequantizes with them as stored (the loaded weight is ``q * scale`` of the
    shipped weight, not a power-of-two rounding of it)."""
    from phaseinterp.models.hf.release_layout import fp8_module_names

    export_release(shipped, tmp_path / "exact", fp8=True, fp8_scales="exact")
    raw = json.loads((tmp_path / "exact" / "config.json").read_text())
    assert raw["quantization_config"]["scale_fmt"] == "float"
    model = pi.load_hf(tmp_path / "exact", dtype=torch.float32)
    assert model.metadata["checkpoint"]["fp8"] and model.metadata["export"]["fp8_scales"] == "exact"
    linear = next(m for m in fp8_module_names(shipped.hf.config) if not m.endswith(".experts"))
    w = shipped.hf.state_dict()[f"{linear}.weight"]
    for scales in ("exact", "pow2"):
        q, scale = quantize_fp8_blocks(w, scales=scales)
        rows, cols = w.shape
        want = (q.float().reshape(scale.shape[0], -1, scale.shape[1], cols // scale.shape[1])
                * scale[:, None, :, None]).reshape(rows, cols)
        assert torch.equal(model.hf.state_dict()[f"{linear}.weight"], want) == (scales == "exact"), scales
    with pytest.raises(ValueError, match="fp8_scales='ue8m0' is not a scale format"):
        export_release(shipped, tmp_path / "bad", fp8=True, fp8_scales="ue8m0")
    assert not (tmp_path / "bad").exists()


def test_fp8_roundtrip_is_idempotent():
    """A weight on the FP8 grid (power-of-two scales) quantizes and dequantizes back bit for bit,
    including the case where the block maximum rounds down to 224 * scale and the next scale halves."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        magnitude = 10 ** (torch.rand(1, generator=gen) * 20 - 10)
        w = torch.randn(256, 384, generator=gen) * torch.logspace(-6, 2, 384) * magnitude
        once = fp8_roundtrip(w)
        assert torch.equal(fp8_roundtrip(once), once)
        assert torch.equal(fp8_roundtrip(once, scales="pow2"), once)
    s = 2.0 ** -7
    w = torch.randn(128, 128, generator=gen) * 20 * s
    w[0, 0], w[1, 1], w[2, 2] = 228 * s, -3 * 2 ** -9 * s, 5 * 2 ** -9 * s  # max: 228 -> e4m3 224; two e4m3 subnormals
    q, scale = quantize_fp8_blocks(w)
    assert scale.item() == s and q.float()[0, 0].item() == 224.0
    once = fp8_roundtrip(w)
    q2, scale2 = quantize_fp8_blocks(once)
    assert scale2.item() == s / 2 and torch.equal(q2.float(), 2 * q.float())  # scale halves, every code doubles
    assert torch.equal(fp8_roundtrip(once), once)
    # every finite e4m3 value, as block content, for block maxima across the whole (224, 448] range of 2^-20..2^9 scales
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    codes = codes[torch.isfinite(codes)]
    for e in range(-20, 10, 3):
        for m in torch.linspace(0.5, 1.0, 33)[1:].tolist():
            block = codes[torch.randint(len(codes), (128, 128), generator=gen)] / 448 * (m * 448 * 2.0 ** e)
            block[0, 0] = m * 448 * 2.0 ** e
            once = fp8_roundtrip(block)
            assert torch.equal(fp8_roundtrip(once), once), (e, m)


def test_fp8_parts_are_exactly_what_the_export_quantizes(shipped, exported):
    """`fp8_parameter_parts` (what FP8-native training fake-quantizes) is the exporter's own FP8 set:
    rounding those parts of the shipped weights gives the FP8 export's loaded weights bit for bit."""
    state = shipped.hf.state_dict()
    parts = fp8_parameter_parts({k: v.shape for k, v in state.items()}, shipped.hf.config)
    assert "model.layers.0.mlp.experts.gate_up_proj" in parts and "lm_head.weight" not in parts
    assert len(parts["model.layers.0.mlp.experts.gate_up_proj"]) == 2 * shipped.hf.config.n_routed_experts
    loaded = pi.load_hf(exported / "fp8", dtype=torch.float32).hf.state_dict()
    assert set(loaded) == set(state)
    for name, w in state.items():
        want = fp8_roundtrip_parts(w, parts[name]) if name in parts else w
        assert torch.equal(loaded[name], want), name
    assert sum(not torch.equal(loaded[n], state[n]) for n in parts) == len(parts)  # float-trained: none on the grid


def test_fp8_native_training_is_straight_through_and_snaps_onto_the_grid(tmp_path):
    """``fp8_weights=True``: the forward sees the FP8-rounded weight, the gradient reaches the float32
    weight unchanged (straight-through), and the saved weights are on the grid, so an FP8 export
    loads them back bit for bit. (Two training steps of dsv4-tiny's recipe with ``fp8_weights``, 4 prompts a step.)"""
    from dataclasses import replace

    from transformers import DeepseekV4ForCausalLM

    from phaseinterp.train.deepseek_v4 import _fp8_parametrize, _fp8_snap, train_tiny
    from phaseinterp.zoo.deepseek_v4 import RECIPES

    assert not RECIPES["dsv4-tiny"].fp8_weights and not RECIPES["dsv4.1-tiny"].fp8_weights  # default: float training
    recipe = replace(RECIPES["dsv4-tiny"], fp8_weights=True)
    torch.manual_seed(0)
    hf = DeepseekV4ForCausalLM(recipe.hf_config(64))
    linear = hf.model.layers[0].self_attn.o_b_proj
    master = linear.weight.detach().clone()
    parts = fp8_parameter_parts({n: p.shape for n, p in hf.named_parameters()}, hf.config)
    done = _fp8_parametrize(hf)
    wrapped = {n.replace(".parametrizations.", ".").removesuffix(".original") for n, _ in hf.named_parameters()
               if ".parametrizations." in n}
    assert wrapped == set(parts) and len(done) == len(parts)  # exactly the FP8 parts' parameters
    assert torch.equal(linear.weight, fp8_roundtrip(master)) and not torch.equal(linear.weight, master)
    c = torch.randn(master.shape)
    (linear.weight * c).sum().backward()
    assert torch.equal(linear.parametrizations.weight.original.grad, c)
    _fp8_snap(done)
    assert not any("parametrizations" in n for n in hf.state_dict())
    assert torch.equal(linear.weight, fp8_roundtrip(master))

    model = train_tiny(replace(recipe, steps=2, batch_size=4, eval_every=2, probe_per_residue=1), tmp_path,
                       progress=False)
    state = model.hf.state_dict()
    assert not any("parametrizations" in n for n in state)
    assert model.metadata["recipe"]["fp8_weights"] is True
    parts = fp8_parameter_parts({k: v.shape for k, v in state.items()}, model.hf.config)
    assert all(torch.equal(fp8_roundtrip_parts(state[n], parts[n]), state[n]) for n in parts)
    assert not torch.equal(fp8_roundtrip(state["lm_head.weight"]), state["lm_head.weight"])  # BF16 in a release
    export_release(model, tmp_path / "fp8", fp8=True, experts="fp8")  # trained on the FP8 grid, experts too
    loaded = pi.load_hf(tmp_path / "fp8", dtype=torch.float32).hf.state_dict()
    assert all(torch.equal(loaded[k], state[k]) for k in state)


# ------------------------------------------------------------------ FP8 precision


def _answer_logits(model, batch, size: int = 256):
    with torch.inference_mode():
        return torch.cat([model(batch.tokens[i:i + size])[torch.arange(min(size, len(batch) - i)),
                                                          batch.answer_pos[i:i + size]].float()
                          for i in range(0, len(batch), size)])


def _compare(model, ref_logits, batch, stride: int):
    """``(max |logit diff|, top-1 agreement, agreement by phase)`` at the answer position."""
    logits = _answer_logits(model, batch)
    agree = (logits.argmax(-1) == ref_logits.argmax(-1)).numpy()
    phase = batch.meta["residue"].to_numpy() % stride
    by_phase = {int(k): float(agree[phase == k].mean()) for k in np.unique(phase)}
    return (logits - ref_logits).abs().max().item(), float(agree.mean()), by_phase, logits


@pytest.fixture(scope="module")
def native_export(tmp_path_factory):
    """``phaseinterp zoo export dsv4-tiny-fp8 --layout deepseek --fp8 --experts fp8 --out DIR`` (power-of-two
    scales; the experts in FP8 blocks, the grid the model was trained on)."""
    from phaseinterp.cli import main

    out = tmp_path_factory.mktemp("native") / "fp8"
    assert main(["zoo", "export", FP8_NATIVE, "--layout", "deepseek", "--fp8", "--experts", "fp8",
                 "--out", str(out)]) == 0
    return out


@pytest.mark.zoo(FP8_NATIVE)
def test_fp8_native_zoo_model_is_dsv4_tiny_trained_fp8(zoo_model):
    """``dsv4-tiny-fp8`` is dsv4-tiny's recipe with ``fp8_weights=True`` and ships its FP8 parts on the grid."""
    from dataclasses import replace

    from phaseinterp.zoo.deepseek_v4 import RECIPES

    recipe = RECIPES[FP8_NATIVE]
    assert recipe == replace(RECIPES["dsv4-tiny"], name=FP8_NATIVE, description=recipe.description, fp8_weights=True)
    model = zoo_model(FP8_NATIVE)
    assert model.metadata["command"] == "phaseinterp zoo build dsv4-tiny-fp8"
    assert model.metadata["recipe"]["fp8_weights"] is True and model.metadata["step"] == recipe.steps
    state = model.hf.state_dict()
    parts = fp8_parameter_parts({k: v.shape for k, v in state.items()}, model.hf.config)
    assert all(torch.equal(fp8_roundtrip_parts(state[n], parts[n]), state[n]) for n in parts)


@pytest.fixture(scope="module")
def native_small(zoo_model):
    """8 prompts per residue of dsv4-tiny-fp8's task and the float32 model's answer-position logits."""
    ref = zoo_model(FP8_NATIVE)
    batch = pi.zoo.task_for(ref).generate(8, seed=0, strict=False)
    return batch, _answer_logits(ref, batch)


@pytest.mark.zoo(FP8_NATIVE)
def test_fp8_native_export_loads_bit_identical(zoo_model, native_export, native_small):
    """The FP8-native model's FP8 export (e4m3, UE8M0 scales) loads back as exactly the shipped float32
    weights, so its logits equal the shipped model's (max |diff| 0.0): names, block scales and
    dequantization are all right. 8 prompts per residue here; the evaluation prompts in the slow test."""
    ref = zoo_model(FP8_NATIVE)
    model = pi.load_hf(native_export, dtype=torch.float32)
    info = model.metadata["checkpoint"]
    assert info["fp8"] and info["layout"] == "deepseek" and model.metadata["export"]["fp8_scales"] == "pow2"
    raw = json.loads((native_export / "config.json").read_text())
    assert raw["quantization_config"]["scale_fmt"] == "ue8m0"
    got, want = model.hf.state_dict(), ref.hf.state_dict()
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    batch, ref_logits = native_small
    diff, agree, by_phase, _ = _compare(model, ref_logits, batch, ref.cfg.stride)
    assert diff == 0.0 and agree == 1.0 and set(by_phase.values()) == {1.0}, (diff, agree, by_phase)


@pytest.mark.zoo(FP8_NATIVE)
def test_fp8_native_negative_controls_one_scale_doubled(zoo_model, native_export, native_small, tmp_path):
    """The check above can fail. The same export with one block's scale doubled (each weight of this
    tiny model is a single 128 x 128 block): ``layers.0.attn.wo_b`` (attention output) loads, but its
    logits move (measured max |diff| 8.5) and top-1 agreement drops to 0.66; ``layers.0.attn.wq_a``,
    which the query RMSNorm after it almost cancels, keeps agreement at 1.0 and moves logits by
    6e-6: only the exact max |diff| == 0 catches that one."""
    from safetensors.torch import load_file, save_file

    ref = zoo_model(FP8_NATIVE)
    batch, ref_logits = native_small
    measured = {}
    for name in ("layers.0.attn.wo_b.scale", "layers.0.attn.wq_a.scale"):
        folder = _copy(native_export, tmp_path / name)
        shard = folder / json.loads((folder / INDEX_FILE).read_text())["weight_map"][name]
        tensors = load_file(shard)
        assert tensors[name].shape == (1, 1)
        tensors[name] = tensors[name] * 2
        save_file(tensors, shard, metadata={"format": "pt"})
        measured[name] = _compare(pi.load_hf(folder, dtype=torch.float32), ref_logits, batch, ref.cfg.stride)[:3]
    diff, agree, _ = measured["layers.0.attn.wo_b.scale"]
    assert diff > 1.0 and agree < 0.99, measured
    diff, agree, _ = measured["layers.0.attn.wq_a.scale"]
    assert 0.0 < diff < 1e-4 and agree == 1.0, measured


def test_fp8_block_layout_matches_transformers_dequantize():
    """The tiny models' FP8 weights are one block each, so the block layout is checked here on a
    multi-block weight: transformers' own ``Fp8Dequantize`` (the load path) gives exactly
    `dequantize_fp8_blocks` of the exporter's blocks, and a transposed scale grid does not."""
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    from phaseinterp.models.hf.export import dequantize_fp8_blocks

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(256, 256, generator=gen) * torch.logspace(-3, 0, 256)[:, None] * torch.logspace(0, -2, 256)
    q, scale = quantize_fp8_blocks(w)
    assert scale.shape == (2, 2) and len(set(scale.flatten().tolist())) > 1
    theirs = Fp8Dequantize(None)._dequantize_one(q, scale, output_dtype=torch.float32)
    assert torch.equal(theirs, dequantize_fp8_blocks(q, scale)) and torch.equal(theirs, fp8_roundtrip(w))
    assert not torch.equal(Fp8Dequantize(None)._dequantize_one(q, scale.T, output_dtype=torch.float32), theirs)


def _profile_with_logits(model, batch):
    """``phase_profile(model, batch)`` and the answer-position logits of the same passes (the profile
    reads them through ``model.last_logits``: one answer position per batch)."""
    outputs = []
    original = model.last_logits

    def spy(tokens):
        out = original(tokens)
        outputs.append(out.detach().clone())
        return out

    model.last_logits = spy  # an instance attribute over the method, deleted below
    try:
        p = pi.phase_profile(model, batch, progress=False)
    finally:
        del model.last_logits
    logits = torch.cat(outputs)
    assert logits.shape == (len(batch), model.cfg.d_vocab)
    return p, logits.float()


@pytest.mark.slow  # two 72-per-residue profiles (logits from the same passes): 59 s on 2 shared cores
@pytest.mark.zoo(FP8_NATIVE)
def test_fp8_native_export_keeps_every_answer_on_the_evaluation_prompts(zoo_model, native_export):
    """The issue's FP8 criterion on the evaluation prompts (72 per residue, seed 0): top-1 agreement
    with the float32 model >= 0.99 overall and at every phase (measured: 1.0, max |logit diff| 0.0),
    and the phase accuracies inside the shipped model's 95% intervals. The shipped model has period 4
    with its best and worst phase intervals apart, as dsv4-tiny (a fixture for phase analysis)."""
    ref = zoo_model(FP8_NATIVE)
    batch = pi.zoo.task_for(ref).generate(N, seed=0)
    shipped_p, ref_logits = _profile_with_logits(ref, batch)
    assert np.array_equal(ref_logits.argmax(-1).numpy(), shipped_p.records.predicted.to_numpy())
    assert shipped_p.period == 4 and shipped_p.period_p_value < 0.05
    best, worst = int(np.nanargmax(shipped_p.phase_accuracy)), int(np.nanargmin(shipped_p.phase_accuracy))
    assert shipped_p.phase_lower[best] > shipped_p.phase_upper[worst]
    model = pi.load_hf(native_export, dtype=torch.float32)
    p, logits = _profile_with_logits(model, batch)
    assert (logits - ref_logits).abs().max().item() == 0.0
    agree = p.records.predicted.to_numpy() == shipped_p.records.predicted.to_numpy()
    by_phase = p.records.assign(agree=agree).groupby("phase").agree.mean()
    assert agree.mean() >= 0.99 and (by_phase >= 0.99).all(), by_phase
    assert np.all(p.phase_accuracy >= shipped_p.phase_lower) and np.all(p.phase_accuracy <= shipped_p.phase_upper), \
        (p.phase_accuracy, shipped_p.phase_lower, shipped_p.phase_upper)
    assert p.period == 4


@pytest.mark.slow  # two 72-per-residue profiles: ~3 min on 2 shared cores
def test_fp8_export_loads_dequantized_and_keeps_the_phase_profile(shipped, exported, shipped_profile):
    """FP8 (e4m3, 128 x 128 blocks, UE8M0 scales) dequantized on CPU: the quantization loss of a
    model trained in float32 and rounded afterwards (a release is trained FP8-native: that is
    ``dsv4-tiny-fp8``, whose export loses nothing, tests above). Measured here: the phase
    accuracies stay inside the shipped model's Wilson intervals; top-1 agreement with the
    full-precision model at the answer position is 95.7% (RESULTS, "Release layout and FP8"), below the
    issue's 99% target: FP8's 3-bit mantissa flips near-tied predictions of this 2-layer-deep
    tiny model (every quantized module alone flips 0-2%). Exact float32 block scales
    (``fp8_scales="exact"``) measured 95.6%, so the power-of-two scale is not the cause."""
    model = pi.load_hf(exported / "fp8", dtype=torch.float32)
    info = model.metadata["checkpoint"]
    assert info["fp8"] and info["dequantized"] == (not pi.models.hf.fp8_kernels_available())
    p = pi.phase_profile(model, pi.zoo.task_for(model), n_per_residue=N, seed=0, progress=False)
    ref = shipped_profile
    assert np.all(p.phase_accuracy >= ref.phase_lower) and np.all(p.phase_accuracy <= ref.phase_upper), \
        (p.phase_accuracy, ref.phase_lower, ref.phase_upper)
    assert p.period == ref.period == 4
    agree = (p.records.predicted.to_numpy() == ref.records.predicted.to_numpy())
    assert 0.93 <= agree.mean() < 1.0  # FP8 changes something, and not much
    by_phase = p.records.assign(agree=agree).groupby("phase").agree.mean()
    assert (by_phase >= 0.9).all(), by_phase


# ------------------------------------------------------------------ MXFP4 experts (issue 34)
def test_mxfp4_packing_is_the_release_layout_both_readers_decode():
    """Codes and bytes by hand: element 2i in the low nibble, 2i+1 in the high one, one E8M0 byte per 32
    values; transformers' own FP4 dequantizer (``expert_dtype="fp4"``) reads the export back exactly."""
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    from phaseinterp.models.hf.export import dequantize_mxfp4, mxfp4_roundtrip, quantize_mxfp4

    row = torch.tensor([0.5, -6.0, 1.0, 0.25, 0.75, 2.5, 5.0, -1.25] + [0.0] * 24)  # group max 6: scale 2^0
    packed, scale = quantize_mxfp4(torch.stack([row, row * 2.0 ** -3]))
    assert packed.dtype == torch.int8 and packed.shape == (2, 16) and scale.shape == (2, 1)
    assert scale.view(torch.uint8).tolist() == [[127], [124]]
    # codes: .5->1, -6->15, 1->2, .25->0 (tie to even), .75->2 (tie to even), 2.5->4, 5->6, -1.25->10 (-1.0)
    assert packed.view(torch.uint8)[0, :4].tolist() == [1 | 15 << 4, 2 | 0 << 4, 2 | 4 << 4, 6 | 10 << 4]
    w = torch.randn(64, 96) * torch.logspace(-3, 1, 96)
    q, s = quantize_mxfp4(w)
    ours = dequantize_mxfp4(q, s)
    theirs = Fp8Dequantize(None)._dequantize_one(q, s, output_dtype=torch.float32)
    assert torch.equal(ours, theirs) and torch.equal(mxfp4_roundtrip(ours), ours)  # a projection
    groups = w.reshape(64, 3, 32)
    # error <= half the widest e2m1 step (4 -> 6) times the scale, and the scale is < 2 max|w| / 6
    assert ((ours.reshape(64, 3, 32) - groups).abs() <= groups.abs().amax(-1, keepdim=True) / 3).all()
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_mxfp4(torch.zeros(4, 48))


def test_fp4_export_loads_as_the_model_with_experts_rounded(shipped, exported):
    """The default export stores the routed experts as MXFP4 (int8 + E8M0 ``.scale``, ``expert_dtype`` "fp4")
    and `load_hf` gives exactly `round_experts_mxfp4` of the shipped model: every tensor equal, so the
    logits are equal (max |diff| 0.0); the rounding itself is not nothing (the unrounded model differs)."""
    import copy

    from safetensors import safe_open

    from phaseinterp.models.hf.export import round_experts_mxfp4

    folder = exported / "fp4"
    raw = json.loads((folder / "config.json").read_text())
    assert raw["expert_dtype"] == "fp4" and raw["quantization_config"]["quant_method"] == "fp8"
    weight_map = json.loads((folder / INDEX_FILE).read_text())["weight_map"]
    with safe_open(folder / weight_map["layers.0.ffn.experts.1.w2.weight"], "pt") as f:
        assert f.get_slice("layers.0.ffn.experts.1.w2.weight").get_dtype() == "I8"
    with safe_open(folder / weight_map["layers.0.ffn.experts.1.w2.scale"], "pt") as f:
        assert f.get_slice("layers.0.ffn.experts.1.w2.scale").get_dtype() == "F8_E8M0"
    model = pi.load_hf(folder)
    info = model.metadata["checkpoint"]
    assert info["fp4_experts"] and not info["fp8"] and info["dequantized"] and info["layout"] == "deepseek"
    twin = round_experts_mxfp4(copy.deepcopy(shipped))
    got, want = model.hf.state_dict(), twin.hf.state_dict()
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    tokens = pi.zoo.task_for(shipped).generate(2, seed=0, strict=False).tokens[:8]
    with torch.no_grad():
        loaded, rounded, exact = (m.hf(input_ids=tokens).logits for m in (model, twin, shipped))
    assert (loaded - rounded).abs().max().item() == 0.0 and (rounded - exact).abs().max().item() > 1e-4


def test_release_format_fp8_dense_fp4_experts_loads_as_both_roundings(shipped, exported):
    """``fp8=True`` with the default experts is the release's own format: FP8 blocks for the dense
    weights, MXFP4 experts. `load_hf` (dequantized here) gives exactly the model with its FP8 parts
    rounded by `fp8_roundtrip_parts` and its experts by `round_experts_mxfp4`."""
    import copy

    from phaseinterp.models.hf.export import round_experts_mxfp4

    model = pi.load_hf(exported / "release", dtype=torch.float32)
    info = model.metadata["checkpoint"]
    assert info["fp8"] and info["fp4_experts"]
    twin = round_experts_mxfp4(copy.deepcopy(shipped)).hf.state_dict()
    parts = fp8_parameter_parts({k: v.shape for k, v in twin.items()}, shipped.hf.config)
    want = {k: fp8_roundtrip_parts(v, parts[k]) if k in parts and ".experts." not in k else v for k, v in twin.items()}
    got = model.hf.state_dict()
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_fp4_experts_without_scales_or_config(exported, tmp_path, no_loading):
    from safetensors.torch import load_file, save_file

    folder = _copy(exported / "fp4", tmp_path / "ck")
    index = json.loads((folder / INDEX_FILE).read_text())
    config = json.loads((folder / "config.json").read_text())
    config.pop("expert_dtype")
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="holds MXFP4 expert .* does not declare expert_dtype 'fp4'"):
        pi.load_hf(folder)
    for shard in set(index["weight_map"].values()):
        tensors = {k: v for k, v in load_file(folder / shard).items() if not k.endswith("w1.scale")}
        save_file(tensors, folder / shard, metadata={"format": "pt"})
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not k.endswith("w1.scale")}
    (folder / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"MXFP4 expert 'layers.0.ffn.experts.0.w1.weight' has no scales"):
        pi.load_hf(folder)


# ------------------------------------------------------------------ offloading
@pytest.fixture(scope="module")
def offloaded(exported, tmp_path_factory):
    return pi.load_hf(exported / "fp32", device_map="auto", max_memory={"cpu": "500KB"},
                      offload_folder=tmp_path_factory.mktemp("offload"))


def test_offloaded_layers_are_on_disk_and_hooks_fire_there(offloaded, shipped):
    placed = offloaded.hf.hf_device_map
    assert "disk" in placed.values() and "model.layers" in offloaded.metadata["checkpoint"]["offloaded"]
    assert all(p.device.type == "meta" for p in offloaded.hf.model.layers[2].parameters())
    tokens = pi.zoo.task_for(shipped).generate(N, seed=0).tokens[:3]
    names = lambda n: n.startswith("blocks.2.") or n.startswith("blocks.0.attn.compressor.")  # noqa: E731
    out, cache = offloaded.run_with_cache(tokens, names_filter=names)
    ref_out, ref_cache = shipped.run_with_cache(tokens, names_filter=names)
    assert torch.equal(out, ref_out)
    assert set(cache.keys()) == set(ref_cache.keys()) and len(cache.keys()) >= 10
    assert all(torch.equal(cache[k], ref_cache[k]) for k in ref_cache.keys())
    assert all(p.device.type == "meta" for p in offloaded.hf.model.layers[2].parameters())  # offloaded again


def test_offloaded_phase_profile_and_ablation_equal_in_memory(offloaded, shipped):
    """3 prompts per residue (72 prompts; strict=False skips moment matching, which identity does not need)."""
    task = pi.zoo.task_for(shipped)
    prompts = task.generate(3, seed=0, strict=False)
    p = pi.phase_profile(offloaded, prompts, progress=False)
    q = pi.phase_profile(shipped, prompts, progress=False)
    assert p.records.equals(q.records) and np.array_equal(p.phase_accuracy, q.phase_accuracy, equal_nan=True)
    a = pi.ablate(offloaded, task, layer=1, prompts=prompts, n_calibration=24)
    b = pi.ablate(shipped, task, layer=1, prompts=prompts, n_calibration=24)
    assert a.relative_change.equals(b.relative_change)  # (a == b compares the model names too)


def test_gate_edits_on_an_offloaded_layer_are_refused(offloaded):
    with pytest.raises(ValueError, match="offloaded"):
        with pi.shift_gates(offloaded, 1, layers=[0]):
            pass


# ------------------------------------------------------------------ bad inputs, before any work
@pytest.fixture
def no_loading(monkeypatch):
    from transformers import DeepseekV4ForCausalLM

    def refuse(*args, **kwargs):
        raise AssertionError("from_pretrained ran: the error came after loading started")

    monkeypatch.setattr(DeepseekV4ForCausalLM, "from_pretrained", refuse)


def test_missing_index_file(exported, tmp_path, no_loading):
    folder = _copy(exported / "fp32", tmp_path / "ck")
    (folder / INDEX_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=f"{INDEX_FILE} does not exist.*model-00001-of"):
        pi.load_hf(folder)


def test_missing_shard(exported, tmp_path, no_loading):
    folder = _copy(exported / "fp32", tmp_path / "ck")
    (folder / "model-00002-of-00005.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="lists shard .*model-00002-of-00005.safetensors, which does not exist"):
        pi.load_hf(folder)


def test_wrong_layout(exported, tmp_path, no_loading):
    from safetensors.torch import save_file

    folder = tmp_path / "ck"
    folder.mkdir()
    shutil.copy(exported / "fp32" / "config.json", folder / "config.json")
    save_file({"transformer.h.0.attn.c_attn.weight": torch.zeros(2, 2)}, folder / "model.safetensors")
    with pytest.raises(ValueError, match="'transformer.h.0.attn.c_attn.weight' is neither"):
        pi.load_hf(folder)


def test_fp8_without_scales(exported, tmp_path, no_loading):
    from safetensors.torch import load_file, save_file

    folder = _copy(exported / "fp8", tmp_path / "ck")
    index = json.loads((folder / INDEX_FILE).read_text())
    for shard in set(index["weight_map"].values()):
        tensors = {k: v for k, v in load_file(folder / shard).items() if not k.endswith(".scale")}
        save_file(tensors, folder / shard, metadata={"format": "pt"})
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not k.endswith(".scale")}
    (folder / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"FP8 tensor 'embed.weight'|FP8 tensor '.*' has no block scales"):
        pi.load_hf(folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("quantization_config")
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="holds FP8 tensor .* no quantization_config"):
        pi.load_hf(folder)


def test_max_memory_too_small_or_inconsistent(exported, no_loading):
    folder = exported / "fp32"
    with pytest.raises(ValueError, match=r"max_memory=\{'cpu': '1KB'\} is too small for anything.*model.layers"):
        pi.load_hf(folder, device_map="auto", max_memory={"cpu": "1KB"})
    with pytest.raises(ValueError, match="needs device_map"):
        pi.load_hf(folder, max_memory={"cpu": "1GB"})
    with pytest.raises(ValueError, match="pass offload_folder"):
        pi.load_hf(folder, device_map="auto", max_memory={"cpu": "500KB"})
    with pytest.raises(ValueError, match="max_memory key 'gpu' is not a device"):
        pi.load_hf(folder, device_map="auto", max_memory={"gpu": "1GB"})
    with pytest.raises(ValueError, match=r"max_memory\['cpu'\]='lots' is not a size"):
        pi.load_hf(folder, device_map="auto", max_memory={"cpu": "lots"})
    with pytest.raises(ValueError, match="offload_folder=.* needs device_map"):
        pi.load_hf(folder, offload_folder="/tmp/x")


def test_export_refuses_bad_input_and_leaves_nothing(shipped, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ValueError, match="is not empty"):
        export_release(shipped, tmp_path / "full")
    with pytest.raises(ValueError, match="layout='hf' is not supported"):
        export_release(shipped, tmp_path / "a", layout="hf")
    with pytest.raises(ValueError, match="not a size"):
        export_release(shipped, tmp_path / "a", max_shard_bytes="big")
    with pytest.raises(ValueError, match="experts='int4' is not an expert format"):
        export_release(shipped, tmp_path / "a", experts="int4")
    with pytest.raises(ValueError, match="experts='fp8' .* needs fp8=True"):
        export_release(shipped, tmp_path / "a", experts="fp8")
    assert not (tmp_path / "a").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["full"]
    assert parse_size("10MiB") == 10 * 2 ** 20 and parse_size("2GB") == 2 * 10 ** 9


def test_cli_zoo_export(tmp_path, capsys):
    from phaseinterp.cli import main

    out = tmp_path / "ck"
    assert main(["zoo", "export", "dsv4-tiny", "--layout", "deepseek", "--fp8", "--out", str(out)]) == 0
    assert (out / INDEX_FILE).is_file() and "FP8 (pow2 scales)" in capsys.readouterr().out
    for argv, message in ((["w4s4", "--layout", "deepseek"], "not a shipped HF DeepSeek-V4"),
                          (["dsv4-tiny", "--layout", "megatron"], "--layout 'megatron' is not supported"),
                          (["dsv4-tiny", "--layout", "deepseek", "--dtype", "int8"], "--dtype 'int8'"),
                          (["dsv4-tiny", "--layout", "deepseek", "--fp8", "--fp8-scales", "ue8m0"],
                           "--fp8-scales 'ue8m0' is not supported"),
                          (["dsv4-tiny", "--layout", "deepseek", "--fp8-scales", "exact"], "--fp8-scales needs --fp8"),
                          (["dsv4-tiny", "--layout", "deepseek", "--experts", "fp8"], "--experts fp8 needs --fp8"),
                          (["dsv4-tiny", "--layout", "deepseek", "--experts", "int4"], "--experts 'int4' is not"),
                          (["dsv4-tiny", "--layout", "deepseek"], "already holds a Hugging Face checkpoint")):
        target = out if message.startswith("already") else tmp_path / "fresh"  # the write rule checks --out first
        assert main(["zoo", "export", *argv, "--out", str(target)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_release_tensors_split_experts_as_transformers_merges_them(shipped):
    state = shipped.hf.state_dict()
    out = release_tensors({k: v for k, v in state.items() if ".layers.0.mlp.experts." in k})
    gate_up = state["model.layers.0.mlp.experts.gate_up_proj"]
    half = gate_up.shape[1] // 2
    assert torch.equal(torch.cat([out["layers.0.ffn.experts.1.w1.weight"], out["layers.0.ffn.experts.1.w3.weight"]]),
                       gate_up[1])
    assert torch.equal(out["layers.0.ffn.experts.0.w2.weight"], state["model.layers.0.mlp.experts.down_proj"][0])
    assert out["layers.0.ffn.experts.0.w1.weight"].shape[0] == half
