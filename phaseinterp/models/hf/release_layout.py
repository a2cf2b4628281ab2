"""DeepSeek's released checkpoint layout for DeepSeek-V4: tensor names, FP8 blocks, config fields, checks.

The released weights use DeepSeek's own names (``layers.0.attn.wq_a.weight``,
``layers.0.attn.compressor.ape``, experts as ``ffn.experts.{e}.w1/w2/w3``) that
transformers renames at load time (``conversion_mapping.py``, ``"deepseek_v4"``).
`release_name` is the inverse of that mapping, written out rule by rule so a reader can
check it; `check_names_roundtrip` asks transformers' own renaming code to map every
exported name back (the exporter refuses to write a name that does not come back).

FP4: the routed experts are MXFP4 as released (``ffn.experts.{e}.w1.weight`` int8 ``[rows, cols/2]``, two
e2m1 codes per byte, low nibble first, + ``.scale``: one E8M0 exponent per 32 values), config
``expert_dtype: "fp4"`` (`phaseinterp.models.hf.export.quantize_mxfp4`).

FP8: the modules transformers' ``FineGrainedFP8`` integration replaces by FP8 modules
(every ``nn.Linear`` / grouped linear / routed-expert stack except ``lm_head`` and the
compressor / indexer projections DeepSeek ships in BF16, ``_keep_in_fp32_modules``) are
stored as ``float8_e4m3fn`` with one scale per ``128 x 128`` block under ``<module>.scale``
(the V4-Flash naming the quantizer renames to ``weight_scale_inv``), scales as UE8M0
(``float8_e8m0fnu``, powers of two, ``scale_fmt="ue8m0"``).

`inspect_checkpoint` reads only file headers: it is the "before any work" check of
`phaseinterp.load_hf` (missing index, missing shard, unknown layout, FP8 without scales).
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from phaseinterp.errors import MissingPathError, UserInputError  # a missing path the user gave: one line, exit 2
from phaseinterp.models.hf.config import config_from_dict, transformers_v4

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
FP8_BLOCK = (128, 128)  # FineGrainedFP8Config's default weight_block_size (DeepSeek's release block)
FP8_DTYPES = ("F8_E4M3",)  # safetensors' name for float8_e4m3fn
FP4_DTYPES = ("I8", "U8")  # MXFP4 experts: two e2m1 codes per byte (the release and transformers: int8)
_FP4_EXPERT = re.compile(r"^layers\.\d+\.ffn\.experts\.\d+\.w[123]\.weight$")
LAYOUTS = ("hf", "deepseek")

# HF name (without the "model." prefix) -> DeepSeek name, applied in order; each rule is the
# inverse of one entry of transformers' conversion_mapping["deepseek_v4"] (named in the comment).
_LEAF_RULES: tuple[tuple[str, str], ...] = (
    (r"^embed_tokens\.weight$", "embed.weight"),                    # ^embed\.weight
    (r"^lm_head\.weight$", "head.weight"),                          # ^head\.weight
    (r"^hc_head\.hc_(fn|base|scale)$", r"hc_head_\1"),              # ^hc_head_fn / _base / _scale
    (r"\.input_layernorm\.", ".attn_norm."),                        # \.attn_norm\.
    (r"\.post_attention_layernorm\.", ".ffn_norm."),                # \.ffn_norm\.
    (r"\.attn_hc\.(fn|base|scale)$", r".hc_attn_\1"),               # \.hc_attn_fn / _base / _scale
    (r"\.ffn_hc\.(fn|base|scale)$", r".hc_ffn_\1"),                 # \.hc_ffn_fn / _base / _scale
    (r"\.self_attn\.sinks$", ".self_attn.attn_sink"),               # \.attn_sink
    (r"\.compressor\.indexer\.scorer\.weights_proj\.", ".indexer.weights_proj."),  # \.indexer\.weights_proj\.
    (r"\.compressor\.indexer\.q_b_proj\.", ".indexer.wq_b."),       # \.indexer\.wq_b\.
    (r"\.compressor\.indexer\.", ".indexer.compressor."),           # \.indexer\.compressor\.
    # the compressors' norms are ``compressor.norm``; the attention's own stays ``attn.kv_norm``
    # (the release's name, and what llama.cpp's converter reads; transformers keeps it as is)
    (r"\.compressor\.kv_norm\.", ".compressor.norm."),              # \.norm\.
    (r"\.position_bias$", ".ape"),                                  # \.ape
    (r"\.q_a_proj\.", ".wq_a."),                                    # \.wq_a\.
    (r"\.self_attn\.q_b_proj\.", ".self_attn.wq_b."),               # \.self_attn\.wq_b\.
    (r"\.q_a_norm\.", ".q_norm."),                                  # \.q_norm\.
    (r"\.o_a_proj\.", ".wo_a."),                                    # \.wo_a\.
    (r"\.o_b_proj\.", ".wo_b."),                                    # \.wo_b\.
    (r"\.shared_experts\.gate_proj\.", ".shared_experts.w1."),      # \.shared_experts\.w1\.
    (r"\.shared_experts\.down_proj\.", ".shared_experts.w2."),      # \.shared_experts\.w2\.
    (r"\.shared_experts\.up_proj\.", ".shared_experts.w3."),        # \.shared_experts\.w3\.
    (r"\.kv_proj\.", ".wkv."),                                      # \.wkv\.
    (r"\.gate_proj\.", ".wgate."),                                  # \.wgate\. (compressor / indexer)
    (r"\.gate\.e_score_correction_bias$", ".gate.bias"),            # \.gate\.bias
    (r"\.self_attn\.", ".attn."),                                   # \.attn\.
    (r"\.mlp\.", ".ffn."),                                          # \.ffn\.
)
_EXPERTS = re.compile(r"^(layers\.\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")


def release_name(hf_name: str) -> str:
    """DeepSeek's released name of one HF parameter name (not the fused experts: see `release_tensors`)."""
    name = hf_name[len("model."):] if hf_name.startswith("model.") else hf_name
    if _EXPERTS.match(name):
        raise UserInputError(f"{hf_name} is a fused expert stack: split it with release_tensors")
    for pattern, repl in _LEAF_RULES:
        name = re.sub(pattern, repl, name)
    return name


def release_tensors(hf_state: dict[str, Any]) -> dict[str, Any]:
    """The HF state dict under DeepSeek's names, the fused experts split back per expert.

    ``experts.gate_up_proj`` ``[E, 2I, D]`` is transformers' ``MergeModulelist(dim=0)`` then
    ``Concatenate(dim=1)`` of ``w1`` and ``w3`` ``[I, D]`` each, so ``w1 = gate_up[e, :I]`` and
    ``w3 = gate_up[e, I:]``; ``experts.down_proj`` ``[E, D, I]`` is the stack of ``w2``.
    """
    out: dict[str, Any] = {}
    for hf_name, tensor in hf_state.items():
        bare = hf_name[len("model."):] if hf_name.startswith("model.") else hf_name
        match = _EXPERTS.match(bare)
        if match is None:
            out[release_name(hf_name)] = tensor
            continue
        layer, kind = match.groups()
        for e in range(tensor.shape[0]):
            if kind == "gate_up_proj":
                half = tensor.shape[1] // 2
                out[f"{layer}.ffn.experts.{e}.w1.weight"] = tensor[e, :half].contiguous()
                out[f"{layer}.ffn.experts.{e}.w3.weight"] = tensor[e, half:].contiguous()
            else:
                out[f"{layer}.ffn.experts.{e}.w2.weight"] = tensor[e].contiguous()
    return out


def _hf_model_on_meta(config: Any):
    with torch.device("meta"):
        return transformers_v4().DeepseekV4ForCausalLM(config)


def _load_time_names(config: Any):
    """``(rename, state)``: transformers' load-time renaming of a checkpoint name (its conversion
    mapping for this model, ``model.`` prefix handling included) and the HF model's state dict."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, rename_source_key

    model = _hf_model_on_meta(config)
    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if not isinstance(t, WeightConverter)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    state = model.state_dict()

    def rename(name: str) -> str:
        target = rename_source_key(name, renamings, converters, base_model_prefix="model", meta_state_dict=state)[0]
        # as transformers' loader: a name that is already the model's own is kept when renaming misses
        return name if target not in state and name in state else target

    return rename, state


def check_names_roundtrip(names: list[str], config: Any) -> None:
    """Map every DeepSeek name through transformers' own renaming (the load path); raise a
    RuntimeError naming the first name that does not land on a parameter of the HF model."""
    rename, state = _load_time_names(config)
    for name in names:
        if _is_scale(name):
            continue  # FP8 block scales: renamed by the FP8 quantizer, checked with their weight
        target = rename(name)
        if target not in state:
            raise RuntimeError(f"release layout: {name!r} maps to {target!r} under transformers' conversion "
                               "mapping, which is no parameter of DeepseekV4ForCausalLM (transformers changed?)")


def fp8_module_names(config: Any) -> list[str]:
    """HF module names that transformers' FP8 integration stores in FP8 (DeepSeek's quantized set):
    what ``replace_with_fp8_linear`` replaces, with the skip list the FP8 quantizer derives
    (``lm_head`` and the model's ``_keep_in_fp32_modules``: the BF16 compressor / indexer projections)."""
    transformers = transformers_v4()
    fp8 = transformers.integrations.finegrained_fp8
    model = _hf_model_on_meta(config)
    quantizer = transformers.quantizers.quantizer_finegrained_fp8.FineGrainedFP8HfQuantizer(
        transformers.FineGrainedFP8Config(weight_block_size=FP8_BLOCK))
    skip = quantizer.get_modules_to_not_convert(model, None, model._keep_in_fp32_modules)
    fp8.replace_with_fp8_linear(model, modules_to_not_convert=skip, quantization_config=quantizer.quantization_config,
                                pre_quantized=True)
    return [n for n, m in model.named_modules() if isinstance(m, (fp8.FP8Linear, fp8.FP8Experts))]


# ---------------------------------------------------------------------------------------------
# Reading a checkpoint directory's headers (no tensor data)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckpointFiles:
    """What the headers of a checkpoint directory say: layout, tensors per file, FP8 status."""

    path: Path
    layout: str  # "hf" or "deepseek"
    weight_map: dict[str, str]  # tensor name -> shard file name
    dtypes: dict[str, str]  # tensor name -> safetensors dtype string
    quantization: Optional[dict] = None  # config.json's quantization_config
    n_bytes: int = 0
    fp8_tensors: tuple[str, ...] = field(default=())
    fp4_tensors: tuple[str, ...] = field(default=())  # MXFP4 routed experts (int8, two e2m1 codes per byte)

    @property
    def shards(self) -> list[str]:
        return sorted(set(self.weight_map.values()))


def _read_header(path: Path) -> dict[str, dict]:
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise UserInputError(f"{path} is not a safetensors file (shorter than its 8-byte header length)")
            (n,) = struct.unpack("<Q", raw)
            if n > 100_000_000:
                raise UserInputError(f"{path} is not a safetensors file (header length {n} bytes)")
            header = json.loads(f.read(n))
    except json.JSONDecodeError as err:
        raise UserInputError(f"{path} is not a safetensors file (header is not JSON: {err})") from None
    header.pop("__metadata__", None)
    return header


def inspect_checkpoint(path: Path, config: dict) -> CheckpointFiles:
    """Check a checkpoint directory from its headers and return what it holds.

    Errors (each names the file or tensor): shard files ``model-*-of-*.safetensors`` without
    ``model.safetensors.index.json``; an index that names a missing shard (or a tensor its
    shard does not hold); tensor names that are neither transformers' nor DeepSeek's layout;
    FP8 tensors without their ``.scale`` / ``weight_scale_inv`` or without a
    ``quantization_config`` in ``config.json``.
    """
    path = Path(path)
    index = path / INDEX_FILE
    shard_like = sorted(p.name for p in path.glob("model-*-of-*.safetensors"))
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise UserInputError(f"{index} is not a safetensors index (needs a 'weight_map' object): {err}") from None
        if not isinstance(weight_map, dict) or not weight_map:
            raise UserInputError(f"{index}: 'weight_map' is empty or not an object")
        missing = sorted({f for f in weight_map.values() if not (path / f).is_file()})
        if missing:
            raise MissingPathError(f"{index} lists shard {path / missing[0]}, which does not exist"
                                    + (f" ({len(missing)} shards missing: {missing})" if len(missing) > 1 else ""))
    elif shard_like:
        raise MissingPathError(f"{index} does not exist, but {path} holds shards ({shard_like[0]}, ...): "
                                "a sharded checkpoint needs its index file")
    elif (path / SINGLE_FILE).is_file():
        weight_map = None
    else:
        raise MissingPathError(f"{path} has a config.json but no safetensors weights ({SINGLE_FILE} or {INDEX_FILE})")

    dtypes: dict[str, str] = {}
    n_bytes = 0
    files = sorted(set(weight_map.values())) if weight_map else [SINGLE_FILE]
    held: dict[str, str] = {}
    for name in files:
        header = _read_header(path / name)
        for tensor, info in header.items():
            held[tensor] = name
            dtypes[tensor] = info["dtype"]
            start, end = info["data_offsets"]
            n_bytes += end - start
    if weight_map is None:
        weight_map = held
    else:
        absent = [t for t, f in weight_map.items() if held.get(t) != f]
        if absent:
            raise UserInputError(f"{index} maps {absent[0]!r} to {path / weight_map[absent[0]]}, which does not hold it")

    layout = _detect_layout(path, list(weight_map), config)
    quant = config.get("quantization_config")
    fp8 = tuple(sorted(t for t, d in dtypes.items() if d in FP8_DTYPES))
    fp4 = tuple(sorted(t for t, d in dtypes.items() if d in FP4_DTYPES and _FP4_EXPERT.match(t)))
    for t in fp4:
        stem = t[: -len(".weight")]
        if f"{stem}.scale" not in weight_map:
            raise UserInputError(f"{path / weight_map[t]}: MXFP4 expert {t!r} has no scales ({stem}.scale); FP4 "
                                "weights cannot be dequantized without them")
    if fp4 and not (isinstance(quant, dict) and quant.get("quant_method") == "fp8"
                    and (quant.get("expert_dtype") or config.get("expert_dtype")) == "fp4"):
        raise UserInputError(f"{path / weight_map[fp4[0]]} holds MXFP4 expert {fp4[0]!r} but {path / 'config.json'} "
                            "does not declare expert_dtype 'fp4' with a quantization_config of quant_method 'fp8'")
    if fp8:
        if not isinstance(quant, dict) or quant.get("quant_method") != "fp8":
            raise UserInputError(f"{path / weight_map[fp8[0]]} holds FP8 tensor {fp8[0]!r} but {path / 'config.json'} "
                                "has no quantization_config with quant_method 'fp8'")
        for t in fp8:
            stem = t[: -len(".weight")] if t.endswith(".weight") else t
            if f"{stem}.scale" not in weight_map and f"{stem}.weight_scale_inv" not in weight_map \
                    and f"{t}_scale_inv" not in weight_map:
                raise UserInputError(f"{path / weight_map[t]}: FP8 tensor {t!r} has no block scales "
                                    f"({stem}.scale or {stem}.weight_scale_inv); FP8 weights cannot be dequantized "
                                    "without them")
    return CheckpointFiles(path=path, layout=layout, weight_map=dict(weight_map), dtypes=dtypes,
                           quantization=quant if isinstance(quant, dict) else None, n_bytes=n_bytes, fp8_tensors=fp8,
                           fp4_tensors=fp4)


def _detect_layout(path: Path, names: list[str], config: dict) -> str:
    """``"deepseek"`` when the names are exactly DeepSeek's released ones, ``"hf"`` when
    transformers' load-time renaming maps each onto the HF model (its own names, or what its
    ``save_pretrained`` writes); otherwise a ValueError naming the first tensor that is neither."""
    cfg = config_from_dict(config)
    weights = [n for n in names if not _is_scale(n) and not n.startswith("mtp.")]  # mtp.*: ignored by transformers
    if set(weights) == set(release_tensors_names(cfg)):
        return "deepseek"
    rename, state = _load_time_names(cfg)
    unknown = [n for n in weights if rename(n) not in state]
    if not unknown:
        return "hf"
    raise UserInputError(f"{path}: tensor {unknown[0]!r} is neither a DeepseekV4ForCausalLM name nor one transformers' "
                        f"deepseek_v4 conversion mapping renames onto the model ({len(unknown)} such tensors; DeepSeek's "
                        f"layout has e.g. 'layers.0.attn.wq_a.weight'): wrong layout, or a config.json that does not "
                        "match the weights")


def _is_scale(name: str) -> bool:
    return name.endswith("weight_scale_inv") or name.endswith("activation_scale") or (
        name.endswith(".scale") and not re.search(r"hc_(attn|ffn|head)_scale$", name))


def release_tensors_names(config: Any) -> list[str]:
    """Every DeepSeek name the released layout has for ``config`` (weights, not scales)."""
    state = _hf_model_on_meta(config).state_dict()
    meta = {k: torch.empty(v.shape, device="meta") for k, v in state.items()}
    return list(release_tensors(meta))
