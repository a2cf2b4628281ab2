"""Write a DeepSeek-V4 in DeepSeek's released layout: sharded safetensors + index, optional FP8.

`export_release(model, out, fp8=True)` writes what a downloaded DeepSeek-V4 checkpoint
looks like (names and packing from `phaseinterp.models.hf.release_layout`), so the shipped
tiny models serve as the fixture for real checkpoints: both go through the same
`phaseinterp.load_hf` and transformers' own conversion. ``phaseinterp zoo export NAME
--layout deepseek [--fp8] --out DIR`` is the command.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import torch
from safetensors.torch import save

from phaseinterp._checks import check_dtype, parse_size
from phaseinterp._files import atomic_write, check_write_target, json_default, move_into_place, normal_mode
from phaseinterp.errors import UserInputError
from phaseinterp.models.hf.deepseek_v4 import SIDECAR_FILE
from phaseinterp.models.hf.release_layout import (
    FP8_BLOCK,
    INDEX_FILE,
    check_names_roundtrip,
    fp8_module_names,
    release_name,
    release_tensors,
)

FP8_MAX = 448.0  # largest finite float8_e4m3fn
# Block-scale formats, as transformers' FineGrainedFP8Config(scale_fmt=...) names them
# (transformers/utils/quantization_config.py: "float" = fp32, V3-style; "ue8m0" = powers of two, V4-style).
FP8_SCALES = {"pow2": "ue8m0", "exact": "float"}
DEFAULT_FP8_SCALES = "pow2"  # DeepSeek-V4's release format (scale_fmt="ue8m0", "V4-style" in transformers' docstring)
EXPORT_LAYOUTS = ("deepseek",)
# How the routed experts are stored: "fp4" = MXFP4 as DeepSeek-V4 releases them (and llama.cpp's
# converter requires); "fp8" = 128 x 128 FP8 blocks like the dense weights (needs fp8=True);
# "float" = unquantized (transformers loads it; llama.cpp's converter refuses it).
EXPERT_FORMATS = ("fp4", "fp8", "float")
MXFP4_GROUP = 32  # values per E8M0 scale (OCP MX)
# the 16 e2m1 codes' values (sign bit 8), transformers' Fp8Dequantize._FP4_E2M1_LUT / ggml's kvalues_mxfp4 / 2
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
E2M1_MAX = 6.0
_EXPERT_WEIGHT = re.compile(r"^layers\.\d+\.ffn\.experts\.\d+\.w[123]\.weight$")
DEFAULT_SHARD_BYTES = 256 * 1024  # small enough that the tiny models span several shards
# config.json fields the release writes under their legacy (V3-style) names; transformers folds them in.
_DERIVED_FIELDS = ("rope_parameters", "partial_rotary_factor", "compress_rates")


@dataclass(frozen=True)
class ExportResult:
    """What `export_release` wrote."""

    path: Path
    shards: tuple[str, ...]
    n_tensors: int
    n_fp8: int
    n_bytes: int
    n_fp4: int = 0  # MXFP4 routed-expert matrices

    def __repr__(self) -> str:
        return (f"ExportResult({str(self.path)!r}: {len(self.shards)} shards, {self.n_tensors} tensors, "
                f"{self.n_fp8} FP8, {self.n_fp4} FP4, {self.n_bytes:,} bytes)")


def quantize_fp8_blocks(weight, block: tuple[int, int] = FP8_BLOCK, scales: str = DEFAULT_FP8_SCALES):
    """``(q, scale)``: ``weight`` ``[..., rows, cols]`` as ``float8_e4m3fn`` with one scale per block.

    ``scales="pow2"``: ``scale[b]`` = ``2 ** ceil(log2(max|w_b| / 448))`` (a power of two, DeepSeek-V4's
    ``ue8m0`` scale format, stored in a float32 container); ``scales="exact"``: ``scale[b]`` =
    ``max|w_b| / 448`` in float32 (``scale_fmt="float"``, V3-style ``weight_scale_inv``), so the
    block's largest weight lands on e4m3's largest value. Either way ``q = w / scale`` and
    ``w ~= q * scale`` (transformers' ``Fp8Dequantize``; its own ``Fp8Quantize`` computes the
    same two scales). A dimension larger than the block must
    be a multiple of it (transformers derives the block from the scale grid); a smaller one
    is one block.
    """
    if scales not in FP8_SCALES:
        raise UserInputError(f"FP8 export: scales={scales!r} is not a scale format (valid: {', '.join(FP8_SCALES)})")
    rows, cols = weight.shape[-2:]
    for size, b, axis in ((rows, block[0], "rows"), (cols, block[1], "cols")):
        if size > b and size % b:
            raise UserInputError(f"FP8 export: {axis}={size} is neither <= the block ({b}) nor a multiple of it")
    bm, bn = min(block[0], rows), min(block[1], cols)
    w = weight.detach().float()
    tiles = w.reshape(*w.shape[:-2], rows // bm, bm, cols // bn, bn)
    amax = tiles.abs().amax(dim=(-3, -1))
    exact = amax.clamp_min(1e-30) / FP8_MAX
    scale = torch.where(amax > 0, exact if scales == "exact" else torch.exp2(torch.ceil(torch.log2(exact))),
                        torch.ones_like(amax))
    q = (tiles / scale.unsqueeze(-1).unsqueeze(-3)).clamp(-FP8_MAX, FP8_MAX).reshape(w.shape)
    return q.to(torch.float8_e4m3fn), scale.to(torch.float32)


def dequantize_fp8_blocks(q, scale):
    """``q * scale`` in float32, one scale per block (the block read from the scale grid): what
    transformers' ``Fp8Dequantize`` computes when it loads an FP8 checkpoint without FP8 kernels."""
    rows, cols = q.shape[-2:]
    sr, sc = scale.shape[-2:]
    tiles = q.to(torch.float32).reshape(*q.shape[:-2], sr, rows // sr, sc, cols // sc)
    return (tiles * scale.to(torch.float32).unsqueeze(-1).unsqueeze(-3)).reshape(q.shape)


def fp8_roundtrip(weight, scales: str = DEFAULT_FP8_SCALES):
    """``dequantize(quantize(weight))`` in float32: the weight an FP8 export of ``weight`` loads as.

    With power-of-two scales (the default) this is a projection: a weight already on the grid comes
    back bit for bit. Why: a block's
    scale ``s`` is the smallest power of two with ``amax / s <= 448``, so ``amax / s`` is in
    ``(224, 448]``; e4m3 rounds that to ``m`` in ``[224, 448]``. Quantizing again, the new block max
    ``m * s`` gives ``s' = s`` (then ``q' = q``) or, when ``m = 224`` (``amax / s`` rounded down),
    ``s' = s / 2`` and ``q' = 2 q``, still e4m3 (``|2q| <= 448``, one exponent up), so ``q' s' = q s``.
    """
    return dequantize_fp8_blocks(*quantize_fp8_blocks(weight, scales=scales))


def quantize_mxfp4(weight):
    """``(packed, scale)``: ``weight`` ``[rows, cols]`` as DeepSeek-V4's released MXFP4 experts.

    ``packed`` ``int8`` ``[rows, cols/2]``: two e2m1 codes per byte, element ``2i`` in the low nibble and
    ``2i+1`` in the high one; ``scale`` ``float8_e8m0fnu`` ``[rows, cols/32]``: one power of two per 32
    consecutive values of a row, so ``w ~= e2m1(code) * scale``. This is the layout both readers
    decode: transformers' ``Fp8Dequantize`` (``expert_dtype="fp4"``: int8 weights, low nibble first,
    the block read from the scale grid) and llama.cpp's converter (``repack_mxfp4_blocks``). The
    scale is the smallest power of two with ``max|w_group| / scale <= 6`` (e2m1's largest value), so
    nothing saturates; codes round to the nearest e2m1 value, ties to the even code.
    """
    rows, cols = weight.shape[-2:]
    if weight.ndim != 2 or cols % MXFP4_GROUP:
        raise UserInputError(f"MXFP4 export: a weight [rows, cols] with cols a multiple of {MXFP4_GROUP}, got "
                            f"{tuple(weight.shape)}")
    w = weight.detach().float().reshape(rows, cols // MXFP4_GROUP, MXFP4_GROUP)
    amax = w.abs().amax(-1, keepdim=True)
    exponent = torch.where(amax > 0, torch.ceil(torch.log2(amax.clamp_min(2.0**-126) / E2M1_MAX)),
                           torch.zeros_like(amax)).clamp(-127, 127)
    x = (w.abs() / torch.exp2(exponent)).clamp(max=E2M1_MAX)
    # nearest of 0, .5, 1, 1.5, 2, 3, 4, 6: count the midpoints passed; at a midpoint the even code wins
    down = torch.tensor([0.25, 1.25, 2.5, 5.0])  # ties go to the lower (even) code
    up = torch.tensor([0.75, 1.75, 3.5])  # ties go to the upper (even) code
    code = (x.unsqueeze(-1) > down).sum(-1) + (x.unsqueeze(-1) >= up).sum(-1)
    code = torch.where((w < 0) & (code > 0), code + 8, code).to(torch.uint8).reshape(rows, cols)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).view(torch.int8)
    scale = (exponent.squeeze(-1) + 127).to(torch.uint8).view(torch.float8_e8m0fnu)
    return packed.contiguous(), scale.contiguous()


def dequantize_mxfp4(packed, scale):
    """``e2m1(code) * 2 ** (scale - 127)`` in float32 ``[rows, 2 * packed cols]`` (see `quantize_mxfp4`)."""
    u8 = packed.contiguous().view(torch.uint8)
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    values = torch.stack([lut[(u8 & 0xF).long()], lut[(u8 >> 4).long()]], dim=-1).reshape(u8.shape[0], -1)
    rows, cols = values.shape
    s = torch.exp2(scale.contiguous().view(torch.uint8).float() - 127.0)
    return (values.reshape(rows, s.shape[1], -1) * s.unsqueeze(-1)).reshape(rows, cols)


def mxfp4_roundtrip(weight):
    """``dequantize(quantize(weight))`` in float32: the weight an MXFP4 export of ``weight`` loads as."""
    return dequantize_mxfp4(*quantize_mxfp4(weight))


def round_experts_mxfp4(model: Any) -> Any:
    """``model`` (a `HookedDeepseekV4` or ``DeepseekV4ForCausalLM``) with every routed expert replaced
    in place by its `mxfp4_roundtrip`, per released matrix (``w1``/``w3`` halves of ``gate_up_proj``
    and each ``down_proj``): the in-memory twin of an ``experts="fp4"`` export. Returns ``model``."""
    hf = getattr(model, "hf", model)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if not re.search(r"\.mlp\.experts\.(gate_up_proj|down_proj)$", name):
                continue
            if name.endswith("gate_up_proj"):
                half = param.shape[1] // 2
                for e in range(param.shape[0]):
                    for rows in (slice(0, half), slice(half, None)):
                        param[e, rows] = mxfp4_roundtrip(param[e, rows]).to(param.dtype)
            else:
                for e in range(param.shape[0]):
                    param[e] = mxfp4_roundtrip(param[e]).to(param.dtype)
    return model


def fp8_parameter_parts(named_shapes: dict[str, Any], hf_config: Any) -> dict[str, list]:
    """Which elements of each HF parameter the release stores in FP8, as one index tensor per
    released FP8 tensor: ``{hf_name: [flat indices shaped like the released tensor], ...}``.

    Derived by running the exporter's own renaming and expert split (`release_tensors`) on index
    tensors, so the parts are exactly those `export_release(fp8=True)` quantizes (one fused expert
    stack ``gate_up_proj`` holds ``w1`` and ``w3`` of every expert: one part each). Parameters with no
    FP8 part are left out."""
    quantized = _fp8_release_names(hf_config)
    out: dict[str, list] = {}
    covered: set[str] = set()
    for name, shape in named_shapes.items():
        index = torch.arange(math.prod(shape)).reshape(tuple(shape))
        parts = {n: t for n, t in release_tensors({name: index}).items() if n in quantized}
        if parts:
            out[name] = list(parts.values())
            covered.update(parts)
    missing = sorted(quantized - covered)
    if missing:
        raise RuntimeError(f"FP8 parts: {missing[0]!r} is quantized by the release but no given parameter holds it")
    return out


def fp8_roundtrip_parts(weight, parts: list, scales: str = DEFAULT_FP8_SCALES):
    """``weight`` (one HF parameter) with each FP8 part (`fp8_parameter_parts`) replaced by its
    `fp8_roundtrip`; elements outside the parts are kept. No gradient flows through it."""
    with torch.no_grad():
        flat = weight.detach().reshape(-1)
        out = flat.clone()
        for index in parts:
            out[index.reshape(-1)] = fp8_roundtrip(flat[index], scales=scales).to(out.dtype).reshape(-1)
        return out.reshape(weight.shape)


def release_config(hf_config: Any, fp8: bool, dtype: Optional[str] = None,
                   fp8_scales: str = DEFAULT_FP8_SCALES, experts: str = "float") -> dict:
    """``config.json`` in the release's fields: ``compress_rate_csa`` / ``compress_rate_hca``,
    ``num_hash_layers``, ``qk_rope_head_dim`` and ``compress_ratios`` (one per layer: 0 for sliding
    attention, else the layer's compress rate; the legacy fields transformers' config folds in, and
    what llama.cpp's converter reads; ``layer_types`` stays explicit too, because transformers maps
    ``compress_ratios`` only for the rates 0, 4 and 128), plus, when anything is quantized (``fp8``, or
    ``experts="fp4"``), the ``quantization_config`` (FP8 e4m3, dynamic activations, 128 x 128 blocks,
    ``scale_fmt`` "ue8m0" for ``fp8_scales="pow2"``, "float" for "exact") and ``expert_dtype``
    ("fp4" or "fp8")."""
    raw = hf_config.to_dict()
    out = {k: v for k, v in raw.items() if k not in _DERIVED_FIELDS and not k.startswith("_")}
    rates = dict(raw["compress_rates"])
    out["compress_rate_csa"] = int(rates["compressed_sparse_attention"])
    out["compress_rate_hca"] = int(rates["heavily_compressed_attention"])
    mlp = list(raw["mlp_layer_types"])
    n_hash = next((i for i, k in enumerate(mlp) if k != "hash_moe"), len(mlp))
    if all(k == "moe" for k in mlp[n_hash:]):
        out["num_hash_layers"] = n_hash
        out.pop("mlp_layer_types")
    out["qk_rope_head_dim"] = int(hf_config.qk_rope_head_dim)
    out["compress_ratios"] = [0 if kind == "sliding_attention" else int(rates[kind]) for kind in raw["layer_types"]]
    out["architectures"] = ["DeepseekV4ForCausalLM"]
    out["model_type"] = "deepseek_v4"
    if dtype is not None:
        out["dtype"] = dtype
    out.pop("quantization_config", None)
    if fp8 or experts == "fp4":
        # with FP4 experts but float dense weights the FP8 quantizer is still the reader transformers
        # has for them (load_hf then dequantizes); the dense weights carry no scales
        out["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                      "weight_block_size": list(FP8_BLOCK), "scale_fmt": FP8_SCALES[fp8_scales]}
        out["expert_dtype"] = "fp4" if experts == "fp4" else "fp8"
    return out


def _fp8_release_names(hf_config: Any) -> set[str]:
    """DeepSeek names of the weights stored in FP8 (``<module>.weight``; experts per expert)."""
    names: set[str] = set()
    for module in fp8_module_names(hf_config):
        if module.endswith(".experts"):
            layer = re.match(r"^model\.(layers\.\d+)\.", module).group(1)
            for e in range(int(hf_config.n_routed_experts)):
                names.update(f"{layer}.ffn.experts.{e}.{w}.weight" for w in ("w1", "w2", "w3"))
        else:
            names.add(release_name(f"{module}.weight"))
    return names


def _natural(name: str):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def export_release(model: Any, out: Union[str, Path], *, fp8: bool = False, fp8_scales: str = DEFAULT_FP8_SCALES,
                   dtype: Any = None,
                   max_shard_bytes: Union[int, str] = DEFAULT_SHARD_BYTES, metadata: Optional[dict] = None,
                   layout: str = "deepseek", experts: Optional[str] = None, overwrite: bool = False) -> ExportResult:
    """Write ``model`` (a `HookedDeepseekV4` or a ``DeepseekV4ForCausalLM``) to ``out`` in DeepSeek's layout.

    ``out`` must not exist or be an empty folder, or (``overwrite=True``) hold a previous HF
    checkpoint (`phaseinterp._files.check_write_target`); everything is written to a temporary folder
    beside it and renamed into place (a failed export leaves nothing). ``fp8``: the modules
    DeepSeek quantizes become ``float8_e4m3fn`` + ``.scale`` (128 x 128 blocks); ``fp8_scales``:
    ``"pow2"`` (power-of-two scales, ``scale_fmt="ue8m0"``, DeepSeek-V4's format, the default) or
    ``"exact"`` (float32 ``max|w| / 448``, ``scale_fmt="float"``); see `quantize_fp8_blocks`. ``dtype``
    (e.g. ``torch.bfloat16``, the release's) casts the other floating tensors (default: the
    model's). ``metadata`` goes to ``phaseinterp.json`` (zoo models: the evaluation task).
    ``experts``: how the routed experts are stored, one of `EXPERT_FORMATS`: ``"fp4"`` (the default:
    MXFP4 as DeepSeek-V4 releases them, `quantize_mxfp4`; the loaded
    experts are then `mxfp4_roundtrip` of the model's, see `round_experts_mxfp4`), ``"fp8"`` (FP8
    blocks like the dense weights; needs ``fp8=True``) or ``"float"`` (unquantized, at ``dtype``).
    """
    if layout not in EXPORT_LAYOUTS:
        raise UserInputError(f"layout={layout!r} is not supported for export (valid: {EXPORT_LAYOUTS})")
    shard_bytes = parse_size(max_shard_bytes, "max_shard_bytes")
    experts = "fp4" if experts is None else experts
    if experts not in EXPERT_FORMATS:
        raise UserInputError(f"experts={experts!r} is not an expert format (valid: {', '.join(EXPERT_FORMATS)})")
    if experts == "fp8" and not fp8:
        raise UserInputError("experts='fp8' stores the experts as FP8 blocks and needs fp8=True (or experts='fp4' / "
                             "'float')")
    if fp8_scales not in FP8_SCALES:
        raise UserInputError(f"fp8_scales={fp8_scales!r} is not a scale format (valid: {', '.join(FP8_SCALES)})")

    dtype = check_dtype(dtype)  # a torch dtype or its name ("bfloat16"), as transformers takes it

    out = check_write_target(out, "Hugging Face checkpoint", overwrite=overwrite, name="out")
    hf = getattr(model, "hf", model)
    config = hf.config
    if getattr(config, "model_type", None) != "deepseek_v4":
        raise UserInputError(f"export_release needs a DeepSeek-V4 model, got model_type={getattr(config, 'model_type', None)!r}")

    tensors = release_tensors({k: v.detach() for k, v in hf.state_dict().items()})
    check_names_roundtrip(list(tensors), config)
    quantized = _fp8_release_names(config) if fp8 else set()
    missing = sorted(quantized - set(tensors))
    if missing:
        raise RuntimeError(f"FP8 export: {missing[0]!r} is quantized by transformers but absent from the model")
    fp4 = {n for n in tensors if _EXPERT_WEIGHT.match(n)} if experts == "fp4" else set()
    quantized -= fp4
    packed: dict[str, Any] = {}
    for name in sorted(tensors, key=_natural):
        t = tensors[name].to("cpu")
        if name in fp4:
            q, scale = quantize_mxfp4(t)
            packed[name] = q
            packed[name[: -len(".weight")] + ".scale"] = scale
        elif name in quantized:
            q, scale = quantize_fp8_blocks(t, scales=fp8_scales)
            packed[name] = q.contiguous()
            packed[name[: -len(".weight")] + ".scale"] = scale.contiguous()
        else:
            packed[name] = (t.to(dtype) if dtype is not None and t.is_floating_point() else t).contiguous()

    shards: list[dict[str, Any]] = [{}]
    size = 0
    for name, t in packed.items():  # natural order: a layer's tensors stay together
        n = t.numel() * t.element_size()
        if shards[-1] and size + n > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += n
    files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        os.chmod(tmp, normal_mode(directory=True))
        weight_map, total = {}, 0
        for file, shard in zip(files, shards):
            atomic_write(tmp / file, save(shard, metadata={"format": "pt"}))
            for name, t in shard.items():
                weight_map[name] = file
                total += t.numel() * t.element_size()
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        atomic_write(tmp / INDEX_FILE, json.dumps(index, indent=2).encode())
        dtype_name = str(dtype).removeprefix("torch.") if dtype is not None else None
        cfg = release_config(config, fp8=fp8, dtype=dtype_name, fp8_scales=fp8_scales, experts=experts)
        atomic_write(tmp / "config.json", json.dumps(cfg, indent=2, default=json_default).encode())

        meta = {**getattr(model, "metadata", {}), **(metadata or {})}
        meta["export"] = {"layout": layout, "fp8": fp8, "dtype": dtype_name, "fp8_block": list(FP8_BLOCK),
                          "fp8_scales": fp8_scales if fp8 else None, "experts": experts}
        atomic_write(tmp / SIDECAR_FILE, json.dumps({"metadata": meta}, indent=2, default=json_default).encode())
        move_into_place(tmp, out)  # empty, absent or (overwrite=True) a previous checkpoint: checked above
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportResult(path=out, shards=tuple(files), n_tensors=len(packed),
                        n_fp8=sum(1 for n in packed if n in quantized), n_bytes=total, n_fp4=len(fp4))
