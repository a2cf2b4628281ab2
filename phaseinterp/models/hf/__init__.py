"""Hugging Face models in phaseinterp's protocol: ``from_hf(hf_model)``, ``load_hf(path)``.

Only DeepSeek-V4 (``model_type="deepseek_v4"``; V4.1 is the same class with
``compress_rates={"compressed_sparse_attention": 2, ...}``) is supported. ``transformers``
is imported only when a model is wrapped or loaded (``pip install 'phaseinterp[hf]'``).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any, Optional, Union

import torch

from phaseinterp._checks import check_device_map, check_dtype
from phaseinterp._files import check_read_path
from phaseinterp.errors import MissingPathError, UserInputError
from phaseinterp.models.hf.config import DeepseekV4HookedConfig, config_from_dict, transformers_v4
from phaseinterp.models.hf.deepseek_v4 import SIDECAR_FILE, HookedDeepseekV4
from phaseinterp.models.hf.offload import check_max_memory
from phaseinterp.models.hf.release_layout import inspect_checkpoint

SUPPORTED_MODEL_TYPES = ("deepseek_v4",)
_WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json")


def from_hf(hf_model: Any, *, name: Optional[str] = None) -> HookedDeepseekV4:
    """Wrap a loaded ``DeepseekV4ForCausalLM`` (weights shared, numerics unchanged; eval mode).

    The HF model must use eager attention (V4's only implementation in transformers 5.24).
    """
    if isinstance(hf_model, (str, bytes, os.PathLike)):
        raise UserInputError(f"from_hf: hf_model={hf_model!r} is a {type(hf_model).__name__}, not a loaded Hugging Face "
                             "model; pass a DeepseekV4ForCausalLM object, or load a checkpoint folder with "
                             f"phaseinterp.load_hf({str(hf_model)!r})")
    config = getattr(hf_model, "config", None)
    if config is None:
        raise UserInputError(f"from_hf: hf_model={hf_model!r:.80} ({type(hf_model).__name__}) is not a Hugging Face "
                             "model (it has no .config); pass a DeepseekV4ForCausalLM")
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UserInputError(f"from_hf: model_type={model_type!r} ({type(hf_model).__name__}) is not supported; "
                         f"supported: {SUPPORTED_MODEL_TYPES}")
    if not hasattr(hf_model, "lm_head") or not hasattr(hf_model, "model"):
        raise UserInputError(f"from_hf needs a DeepseekV4ForCausalLM (with lm_head), got {type(hf_model).__name__}")
    impl = getattr(hf_model.config, "_attn_implementation", "eager")
    if impl not in (None, "eager"):
        raise UserInputError(f"from_hf: attention implementation {impl!r} is not supported (valid: 'eager')")
    model = HookedDeepseekV4(hf_model, name=name)
    model.eval()  # the HF model too: experiments expect eval mode, as from_pretrained gives
    return model


def load_hf(path: Union[str, Path], *, device_map: Union[str, dict, None] = None, dtype: Any = None,
            name: Optional[str] = None, max_memory: Optional[dict] = None,
            offload_folder: Union[str, Path, None] = None) -> HookedDeepseekV4:
    """Load a local DeepSeek-V4 checkpoint directory (never the Hub) and wrap it with `from_hf`.

    Either layout loads: transformers' own names (``save_pretrained``) or DeepSeek's released
    names (``layers.0.attn.wq_a.weight``, ``ffn.experts.0.w1.weight``, ...; sharded with
    ``model.safetensors.index.json``), which transformers' conversion mapping renames. FP8
    checkpoints (``quantization_config.quant_method == "fp8"``, e4m3 weights with block
    ``.scale``) are dequantized to ``dtype`` on machines without FP8 kernels (CPU, GPUs below
    compute capability 8.9) and kept in FP8 with transformers' kernels otherwise. MXFP4 routed
    experts (``expert_dtype: "fp4"``, as released) are read by the same quantizer; beside float
    dense weights they are always dequantized.

    ``device_map`` / ``max_memory`` / ``offload_folder`` go to ``from_pretrained`` (accelerate):
    ``device_map="auto"`` spreads whole decoder layers over the GPUs, then CPU, then disk
    (``offload_folder``); the wrapper loads an offloaded layer for the duration of its forward.
    ``max_memory`` values are bytes or strings such as ``"70GiB"``. ``dtype`` (e.g.
    ``torch.bfloat16``; default: the checkpoint's). A ``phaseinterp.json`` beside the checkpoint
    (zoo models) fills ``model.metadata`` (the evaluation task); ``model.metadata["checkpoint"]``
    says what was loaded (layout, FP8, dequantized, offloaded layers).

    Checked from ``config.json`` and the safetensors headers before any weight is read, each
    error naming the file or value: a missing directory / config / weights, a sharded
    checkpoint without its index, an index naming a missing shard, tensor names of neither
    layout, FP8 tensors without scales, a ``max_memory`` too small for any decoder layer.
    """
    device_map = check_device_map(device_map)  # every device named exists here: before any weight is read
    dtype = check_dtype(dtype, allow_auto=True)  # "bfloat16" as transformers takes it

    path = check_read_path(path, "a local Hugging Face DeepSeek-V4 checkpoint folder (config.json + weights)",
                           name="path")
    config_path = path / "config.json"
    if not config_path.is_file():
        raise MissingPathError(f"{config_path} does not exist: {path} is not a Hugging Face model directory")
    try:
        raw_config = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise UserInputError(f"{config_path} is not valid JSON: {err}") from None
    model_type = raw_config.get("model_type") if isinstance(raw_config, dict) else None
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UserInputError(f"{path}: model_type={model_type!r} is not supported (supported: {SUPPORTED_MODEL_TYPES})")
    if not any(any(path.glob(p)) for p in _WEIGHT_PATTERNS):
        raise MissingPathError(f"{path} has a config.json but no weights (*.safetensors or pytorch_model*.bin)")
    if offload_folder is not None and device_map is None:
        raise UserInputError(f"offload_folder={str(offload_folder)!r} needs device_map (e.g. device_map='auto')")
    transformers = transformers_v4()
    files = None
    for weights in sorted(path.glob("*.safetensors")):
        check_safetensors_file(weights)
    if any(path.glob("*.safetensors")) or (path / "model.safetensors.index.json").exists():
        files = inspect_checkpoint(path, raw_config)
    fp8 = files is not None and bool(files.fp8_tensors)
    fp4 = files is not None and bool(files.fp4_tensors)
    if max_memory is not None or device_map is not None:
        layer_bytes, total = _layer_bytes(config_from_dict(raw_config), dtype, raw_config)
        check_max_memory(max_memory, device_map, None if offload_folder is None else str(offload_folder),
                         layer_bytes, total)

    kwargs: dict[str, Any] = {"local_files_only": True, "attn_implementation": "eager"}
    if device_map is not None:
        kwargs["device_map"] = device_map
    if dtype is not None:
        kwargs["dtype"] = dtype
    if max_memory is not None:
        kwargs["max_memory"] = max_memory
    if offload_folder is not None:
        kwargs["offload_folder"] = str(offload_folder)
    dequantize = False
    if fp8 or fp4:
        # FP4 experts beside float dense weights: transformers' FP8 modules would expect FP8 dense weights
        dequantize = not fp8_kernels_available() or not fp8
        quant = {k: v for k, v in files.quantization.items() if k != "quant_method"}
        quant["expert_dtype"] = quant.get("expert_dtype", raw_config.get("expert_dtype", "fp8"))
        kwargs["quantization_config"] = transformers.FineGrainedFP8Config(**{**quant, "dequantize": dequantize})
    try:
        hf_model = transformers.DeepseekV4ForCausalLM.from_pretrained(str(path), **kwargs)
    except RuntimeError as err:  # transformers' shape check: config.json and the weights disagree
        if "mismatched_sizes" not in str(err) and "size mismatch" not in str(err):
            raise
        raise UserInputError(f"{config_path} does not fit the weights in {path}: tensor shapes differ (see transformers' "
                             "load report above); use the config.json the weights were saved with") from None
    model = from_hf(hf_model, name=name or path.name)
    sidecar = path / SIDECAR_FILE
    if sidecar.is_file():
        model.metadata.update(json.loads(sidecar.read_text()).get("metadata", {}))
    placed = getattr(hf_model, "hf_device_map", None) or {}
    on_gpu = any(v not in ("cpu", "disk") for v in placed.values())  # then "cpu" means CPU offload too
    model.metadata["checkpoint"] = {
        "path": str(path), "layout": files.layout if files is not None else "hf", "fp8": fp8, "fp4_experts": fp4,
        "dequantized": dequantize,
        "offloaded": sorted(k for k, v in placed.items() if v == "disk" or (on_gpu and v == "cpu")),
    }
    return model


def check_safetensors_file(file: Path) -> None:
    """A UserInputError naming ``file`` when it is not a complete safetensors file: shorter than its
    8-byte header length, a header that is not JSON, or tensor data reaching past the end (a
    truncated download or copy), read from the header alone, before transformers opens it."""
    size = file.stat().st_size
    what = f"{file} is not a complete safetensors file"
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise UserInputError(f"{what}: {size} bytes, shorter than its 8-byte header length (truncated or empty)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise UserInputError(f"{what}: its header claims {n:,} bytes but the file has {size:,} (truncated)")
        try:
            header = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError):
            raise UserInputError(f"{what}: its header is not JSON (corrupt)") from None
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)
            and isinstance(v.get("data_offsets"), list) and len(v["data_offsets"]) == 2]
    if not isinstance(header, dict) or (ends and max(ends) > size - 8 - n):
        raise UserInputError(f"{what}: its tensors need {8 + n + max(ends or [0]):,} bytes but the file has {size:,} "
                             "(truncated)")


def fp8_kernels_available() -> bool:
    """Whether transformers' FP8 kernels can run here (a CUDA GPU of compute capability >= 8.9,
    the condition transformers' FP8 quantizer checks); otherwise FP8 weights are dequantized."""
    if not torch.cuda.is_available():
        return False
    major, minor = torch.cuda.get_device_capability()
    return (major, minor) >= (8, 9)


def _layer_bytes(config: Any, dtype: Any, raw_config: dict) -> tuple[dict[str, int], int]:
    """Bytes per decoder layer and in all at the dtype the weights will have in memory
    (``dtype``, else the checkpoint's ``dtype``), from the architecture on ``meta``."""
    if not isinstance(dtype, torch.dtype):
        dtype = getattr(torch, str(raw_config.get("dtype") or raw_config.get("torch_dtype") or "float32"))
    with torch.device("meta"):
        model = transformers_v4().DeepseekV4ForCausalLM(config)
    width = torch.tensor([], dtype=dtype).element_size()
    per_layer = {f"model.layers.{i}": sum(p.numel() for p in layer.parameters()) * width
                 for i, layer in enumerate(model.model.layers)}
    total = sum(p.numel() for p in model.parameters()) * width
    return per_layer, total


__all__ = ["DeepseekV4HookedConfig", "HookedDeepseekV4", "fp8_kernels_available", "from_hf", "load_hf"]
