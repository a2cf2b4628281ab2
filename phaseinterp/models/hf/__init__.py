"""Hugging Face models in phaseinterp's protocol: ``from_hf(hf_model)``, ``load_hf(path)``.

Only DeepSeek-V4 (``model_type="deepseek_v4"``; V4.1 is the same class with
``compress_rates={"compressed_sparse_attention": 2, ...}``) is supported. ``transformers``
is imported only when a model is wrapped or loaded (``pip install 'phaseinterp[hf]'``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Union

from phaseinterp.models.hf.deepseek_v4 import SIDECAR_FILE, DeepseekV4HookedConfig, HookedDeepseekV4

SUPPORTED_MODEL_TYPES = ("deepseek_v4",)
_WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json")


def from_hf(hf_model: Any, name: Optional[str] = None) -> HookedDeepseekV4:
    """Wrap a loaded ``DeepseekV4ForCausalLM`` (weights shared, numerics unchanged; eval mode).

    The HF model must use eager attention (V4's only implementation in transformers 5.24).
    """
    model_type = getattr(getattr(hf_model, "config", None), "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"from_hf: model_type={model_type!r} ({type(hf_model).__name__}) is not supported; "
                         f"supported: {SUPPORTED_MODEL_TYPES}")
    if not hasattr(hf_model, "lm_head") or not hasattr(hf_model, "model"):
        raise ValueError(f"from_hf needs a DeepseekV4ForCausalLM (with lm_head), got {type(hf_model).__name__}")
    impl = getattr(hf_model.config, "_attn_implementation", "eager")
    if impl not in (None, "eager"):
        raise ValueError(f"from_hf: attention implementation {impl!r} is not supported (valid: 'eager')")
    model = HookedDeepseekV4(hf_model, name=name)
    model.eval()  # the HF model too: experiments expect eval mode, as from_pretrained gives
    return model


def load_hf(path: Union[str, Path], device_map: Union[str, dict, None] = None, dtype: Any = None,
            name: Optional[str] = None) -> HookedDeepseekV4:
    """Load a local Hugging Face checkpoint directory (never the Hub) and wrap it with `from_hf`.

    ``device_map`` is passed to ``from_pretrained`` (``"auto"`` spreads the decoder layers over
    the visible GPUs with accelerate; a whole decoder layer stays on one device). ``dtype``
    (e.g. ``torch.bfloat16``; default: the checkpoint's). A ``phaseinterp.json`` beside the
    checkpoint (zoo models) fills ``model.metadata`` (the evaluation task).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (load_hf reads a local checkpoint directory)")
    if not path.is_dir():
        raise ValueError(f"{path} is not a directory (load_hf reads a local checkpoint directory)")
    config_path = path / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} does not exist: {path} is not a Hugging Face model directory")
    try:
        model_type = json.loads(config_path.read_text()).get("model_type")
    except json.JSONDecodeError as err:
        raise ValueError(f"{config_path} is not valid JSON: {err}") from None
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"{path}: model_type={model_type!r} is not supported (supported: {SUPPORTED_MODEL_TYPES})")
    if not any(any(path.glob(p)) for p in _WEIGHT_PATTERNS):
        raise FileNotFoundError(f"{path} has a config.json but no weights (*.safetensors or pytorch_model*.bin)")
    from transformers import DeepseekV4ForCausalLM

    kwargs: dict[str, Any] = {"local_files_only": True, "attn_implementation": "eager"}
    if device_map is not None:
        kwargs["device_map"] = device_map
    if dtype is not None:
        kwargs["dtype"] = dtype
    hf_model = DeepseekV4ForCausalLM.from_pretrained(str(path), **kwargs)
    model = from_hf(hf_model, name=name or path.name)
    sidecar = path / SIDECAR_FILE
    if sidecar.is_file():
        model.metadata.update(json.loads(sidecar.read_text()).get("metadata", {}))
    return model


__all__ = ["DeepseekV4HookedConfig", "HookedDeepseekV4", "from_hf", "load_hf"]
