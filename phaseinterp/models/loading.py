"""One loader: a zoo name or a checkpoint folder of either family -> a model in eval mode.

`load` is ``phaseinterp.load``; the CLI, the report and the examples call it. `check_source` and
`peek` answer from config.json alone (no weights), so callers refuse a bad name, a layer out of
range or a wrong stride before a load that can take many seconds.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional, Union

import torch.nn as nn

from phaseinterp._checks import check_device, check_dtype, closest_names
from phaseinterp._files import check_read_path, expand_user, is_path, shown_path
from phaseinterp.config import CompressedConfig
from phaseinterp.errors import MissingPathError, UserInputError
from phaseinterp.models import catalog
from phaseinterp.models.hf import load_hf
from phaseinterp.models.hf.config import DeepseekV4HookedConfig, transformers_v4
from phaseinterp.models.hf.deepseek_v4 import SIDECAR_FILE
from phaseinterp.models.transformer import CompressedTransformer

ACCEPTED = ("a shipped zoo name (`phaseinterp zoo list`), a phaseinterp checkpoint folder "
            "(CompressedTransformer.save_pretrained: config.json + model.safetensors), or a Hugging Face "
            "DeepSeek-V4 folder (config.json with model_type 'deepseek_v4', in transformers' or DeepSeek's "
            "release layout)")


def load(name_or_path: Union[str, Path, Any], *, device=None, dtype=None, device_map=None,
         max_memory: Optional[dict] = None, offload_folder: Union[str, Path, None] = None):
    """The model named by ``name_or_path``, in eval mode:

    - a zoo name of either family (``"w4s4"``, ``"dsv4-tiny"``; `phaseinterp.models.catalog.available`);
    - a phaseinterp checkpoint folder (``CompressedTransformer.save_pretrained``) -> `CompressedTransformer`;
    - a Hugging Face DeepSeek-V4 folder, in transformers' layout or DeepSeek's release layout, FP8 or
      not -> `HookedDeepseekV4` (through `phaseinterp.models.hf.load_hf`);
    - a model object: returned as is (eval mode), so functions can take either.

    ``device``: a torch device this machine has (default: cpu, or where ``device_map`` puts it).
    ``dtype`` (e.g. ``torch.bfloat16`` or ``"bfloat16"``): the weights' dtype (default: the
    checkpoint's). ``device_map`` / ``max_memory`` / ``offload_folder``: accelerate's placement and
    offloading, Hugging Face checkpoints only (`load_hf`). Anything else is a `UserInputError`
    naming the value and what is accepted."""
    if isinstance(name_or_path, nn.Module):
        given = {k: v for k, v in (("device", device), ("dtype", dtype), ("device_map", device_map),
                                   ("max_memory", max_memory), ("offload_folder", offload_folder)) if v is not None}
        if given:
            raise UserInputError(f"load: {', '.join(given)} apply when loading; {type(name_or_path).__name__} is "
                                 "already a model (move it with .to())")
        return name_or_path.eval()
    device = check_device(device)
    dtype = check_dtype(dtype)
    if device is not None and device_map is not None:
        raise UserInputError(f"device={str(device)!r} and device_map={device_map!r}: pass one (device_map places "
                             "each layer; device puts the whole model on one device)")
    kind = check_source(name_or_path)  # the path as given: a refusal shows it and what ``~`` expanded to
    name_or_path = expand_user(name_or_path)
    hf_options = {"device_map": device_map, "max_memory": max_memory, "offload_folder": offload_folder}
    if kind != "deepseek_v4":
        extra = [k for k, v in hf_options.items() if v is not None]
        if extra:
            raise UserInputError(f"{', '.join(extra)} apply to Hugging Face DeepSeek-V4 checkpoints; {name_or_path!r} "
                                 "is a phaseinterp model (pass device= instead)")
    if kind == "zoo":
        model = catalog.load(str(name_or_path), device=device)
        if dtype is not None:
            model.to(dtype)
    elif kind == "deepseek_v4":
        model = load_hf(Path(name_or_path), dtype=dtype, **hf_options)
        if device is not None:
            model.to(device)
    else:
        model = CompressedTransformer.from_pretrained(Path(name_or_path), device=device)
        if dtype is not None:
            model.to(dtype)
    return model.eval()


def looks_like_path(value: Any) -> bool:
    """Whether the user meant ``value`` as a path rather than a zoo name: something exists there (a file,
    a folder, a link), or it is written as a path (a folder separator, a leading ``~`` or ``.``)."""
    if not is_path(value):
        return False
    text = os.fspath(value)
    return os.path.lexists(expand_user(text)) or os.sep in text or "/" in text or text.startswith(("~", "."))


def check_source(name_or_path, *, name: str = "model") -> str:
    """What ``name_or_path`` names, from config.json alone (no weights read): ``"zoo"`` (a shipped zoo
    model of either family), ``"phaseinterp"`` (a `CompressedTransformer` checkpoint folder) or
    ``"deepseek_v4"`` (a Hugging Face DeepSeek-V4 folder, either layout); anything else is a
    `UserInputError` (`MissingPathError` for a known recipe not built) naming it (as the argument
    ``name``: ``model``, ``--twin``) and what is accepted. A path goes through the readers' door
    (`phaseinterp._files.check_read_path`: missing, a file, an empty folder, a dangling link,
    unreadable) before its config.json is read."""
    if not is_path(name_or_path):
        raise UserInputError(f"{name}={name_or_path!r} ({type(name_or_path).__name__}) is not a name or a path; "
                             f"accepted: {ACCEPTED}")
    given = name_or_path
    name_or_path = expand_user(name_or_path)
    path = Path(name_or_path)
    if looks_like_path(given) and str(given) not in catalog.available():
        path = check_read_path(given, f"a checkpoint folder or a zoo name; accepted: {ACCEPTED}", name=name)
    config = path / "config.json"
    if config.is_file():
        try:
            raw = json.loads(config.read_text())
        except (OSError, ValueError) as err:
            raise UserInputError(f"{config} is not valid JSON ({err}); accepted: {ACCEPTED}") from None
        if isinstance(raw, dict) and raw.get("model_type") == "deepseek_v4":
            _need_transformers(f"{path} is a Hugging Face DeepSeek-V4 checkpoint")
            return "deepseek_v4"
        if isinstance(raw, dict) and "model" in raw:
            return "phaseinterp"
        model_type = raw.get("model_type") if isinstance(raw, dict) else None
        raise UserInputError(f"{path} has a config.json that is neither a phaseinterp checkpoint's (no 'model' "
                             f"entry) nor a DeepSeek-V4 one (model_type={model_type!r}); accepted: {ACCEPTED}")
    text = str(name_or_path)
    shipped = catalog.available()  # both families
    if text in shipped:
        if text in catalog.HF_MODELS:
            _need_transformers(f"zoo model {text!r} is a Hugging Face DeepSeek-V4 checkpoint")
        return "zoo"
    if text in catalog.MODELS:
        raise MissingPathError(f"zoo model {text!r} is a recipe without a shipped checkpoint; build it with "
                               f"`{catalog.command(text)}` (shipped: {', '.join(shipped)})")
    if path.is_dir():
        raise UserInputError(f"{shown_path(name, given)} is not a checkpoint (a folder without config.json); "
                             f"accepted: {ACCEPTED}")
    raise UserInputError(f"{name}={text!r} is neither a shipped zoo model ({', '.join(shipped)}) nor a checkpoint "
                         f"directory (with config.json){nearest_name(text, catalog.MODELS)}"
                         f"; accepted: {ACCEPTED}")


def _need_transformers(what: str) -> None:
    if importlib.util.find_spec("transformers") is None:
        raise UserInputError(f"{what} and needs transformers (the 'hf' extra: pip install -e '.[hf]')")


def nearest_name(name: str, names) -> str:
    """``"; did you mean 'w4s4'?"`` for the closest of ``names`` to ``name`` (case-insensitive), or ""."""
    close = closest_names(name, names, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def peek(name_or_path):
    """What the config says about a model, without loading its weights: an object with ``cfg``
    (`CompressedConfig`, or `DeepseekV4HookedConfig` for a DeepSeek-V4 folder or zoo name) and
    ``metadata`` (task, zoo name), or None when that cannot be read cheaply (a model object is
    returned as is). Lets callers refuse a layer out of range or a wrong stride before the load."""
    if not isinstance(name_or_path, (str, Path)):
        return name_or_path
    name_or_path = expand_user(name_or_path)
    path = Path(name_or_path)
    if not (path / "config.json").is_file():
        path = catalog.CHECKPOINT_DIR / str(name_or_path)
    try:
        config = json.loads((path / "config.json").read_text())
        if config.get("model_type") == "deepseek_v4":
            return _peek_hf(path, config)
        return SimpleNamespace(cfg=CompressedConfig.from_dict(config["model"]), metadata=config.get("metadata", {}))
    except (OSError, ValueError, KeyError, TypeError, ImportError):
        return None  # not a checkpoint this can read (or no transformers), or a broken one: loading reports it


def _peek_hf(path: Path, config: dict):
    """A Hugging Face DeepSeek-V4 checkpoint's `DeepseekV4HookedConfig` and phaseinterp metadata from
    its config.json and sidecar (transformers' config class only: no weights are read)."""
    hf_config = transformers_v4().DeepseekV4Config.from_dict({k: v for k, v in config.items() if k != "model_type"})
    sidecar = path / SIDECAR_FILE
    metadata = json.loads(sidecar.read_text()).get("metadata", {}) if sidecar.is_file() else {}
    return SimpleNamespace(cfg=DeepseekV4HookedConfig.from_hf(hf_config, name=path.name), metadata=metadata)


__all__ = ["ACCEPTED", "check_source", "load", "looks_like_path", "nearest_name", "peek"]
