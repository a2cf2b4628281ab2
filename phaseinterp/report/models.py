"""Which model a report is about: checked, peeked at and loaded from a model object, a zoo name or
a checkpoint directory, and named (its label and the one name its files in ``data/`` carry)."""

from __future__ import annotations

from pathlib import Path
from typing import Union

from phaseinterp.errors import UserInputError


def check_model_source(model_or_name) -> None:
    """Raise a ValueError unless ``model_or_name`` is a model object, a checkpoint directory or
    the name of a zoo model whose checkpoint ships (cheap: reads no weights)."""
    from phaseinterp import zoo

    if not isinstance(model_or_name, (str, Path)):
        return
    path = Path(model_or_name)
    if (path / "config.json").is_file():
        return
    name = str(model_or_name)
    from phaseinterp.zoo import deepseek_v4 as hf_zoo

    hf_shipped = hf_zoo.available()
    shipped = zoo.available()  # both families
    if name in shipped:
        if name in hf_shipped:
            import importlib.util

            if importlib.util.find_spec("transformers") is None:
                raise UserInputError(f"zoo model {name!r} is a Hugging Face DeepSeek-V4 checkpoint and needs transformers "
                                 "(the 'hf' extra: pip install -e '.[hf]')")
        return
    if name in zoo.ENTRIES:
        raise UserInputError(f"zoo model {name!r} is a recipe without a shipped checkpoint; build it with "
                         f"`phaseinterp zoo build {name}` (shipped: {', '.join(shipped)})")
    if path.is_dir():
        raise UserInputError(f"directory {name!r} is not a checkpoint (no config.json in it)")
    if path.exists():
        raise UserInputError(f"model {name!r} is a file; pass a checkpoint directory or a zoo name")
    raise UserInputError(f"model {name!r} is neither a shipped zoo model ({', '.join(shipped)}) nor a checkpoint "
                     f"directory (with config.json){nearest_name(name, list(zoo.ENTRIES) + hf_shipped)}")


def nearest_name(name: str, names) -> str:
    """``"; did you mean 'w4s4'?"`` for the closest of ``names`` to ``name`` (case-insensitive), or ""."""
    import difflib

    by_lower = {n.lower(): n for n in names}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return f"; did you mean {by_lower[close[0]]!r}?" if close else ""


def peek_model(model_or_name):
    """What the config says about a model, without loading its weights: an object with ``cfg``
    (`CompressedConfig`) and ``metadata`` (task, zoo name), or None when that cannot be read cheaply
    (a model object is returned as is; Hugging Face checkpoints return None). Lets callers refuse
    a layer out of range or a wrong stride before a load that can take many seconds."""
    import json
    from types import SimpleNamespace

    from phaseinterp import zoo
    from phaseinterp.config import CompressedConfig

    if not isinstance(model_or_name, (str, Path)):
        return model_or_name
    path = Path(model_or_name)
    if not (path / "config.json").is_file():
        path = zoo.CHECKPOINT_DIR / str(model_or_name)
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
    import json
    from types import SimpleNamespace

    from transformers import DeepseekV4Config

    from phaseinterp.models.hf.config import DeepseekV4HookedConfig
    from phaseinterp.models.hf.deepseek_v4 import SIDECAR_FILE

    hf_config = DeepseekV4Config.from_dict({k: v for k, v in config.items() if k != "model_type"})
    sidecar = path / SIDECAR_FILE
    metadata = json.loads(sidecar.read_text()).get("metadata", {}) if sidecar.is_file() else {}
    return SimpleNamespace(cfg=DeepseekV4HookedConfig.from_hf(hf_config, name=path.name), metadata=metadata)


def load_model(model_or_name, device=None):
    """A model object, a zoo name or a checkpoint directory -> a model in eval mode."""
    from phaseinterp import zoo
    from phaseinterp._checks import check_device
    from phaseinterp.models import CompressedTransformer

    device = check_device(device)
    check_model_source(model_or_name)
    if not isinstance(model_or_name, (str, Path)):
        model = model_or_name
    elif (Path(model_or_name) / "config.json").is_file():
        model = CompressedTransformer.from_pretrained(Path(model_or_name), device=device)
    else:
        model = zoo.load(str(model_or_name), device=device)
    model.eval()
    return model


def check_twin(model, twin) -> None:
    """A ValueError when ``twin`` is ``model`` itself (the same object, zoo name or checkpoint folder)."""
    if twin is None:
        return
    if twin is model or (isinstance(model, (str, Path)) and isinstance(twin, (str, Path))
                         and _model_path(model) == _model_path(twin)):
        raise UserInputError(f"twin={str(twin) if isinstance(twin, (str, Path)) else type(twin).__name__!r} is the "
                         "model itself: a model is never its own twin; pass its full-attention twin (the zoo's "
                         "compressed models: 'full') or twin=None")


def _model_path(name: Union[str, Path]) -> Path:
    from phaseinterp import zoo

    path = Path(name)
    if not (path / "config.json").is_file() and (zoo.CHECKPOINT_DIR / str(name)).is_dir():
        path = zoo.CHECKPOINT_DIR / str(name)
    return path.resolve()


def model_label(model) -> str:
    name = getattr(model, "metadata", {}).get("zoo_name")
    return f"{name} ({model.cfg.label})" if name else model.cfg.label


def slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text).strip("_").lower()


def data_name(model) -> str:
    """The one name a model's files in ``data/`` carry: its zoo name, else its config label, as a slug
    (``profile_w4s4_phases.csv``, ``profile_w4s4_staggered_phases.csv``)."""
    return slug(getattr(model, "metadata", {}).get("zoo_name") or getattr(model.cfg, "label", type(model).__name__))
