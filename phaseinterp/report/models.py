"""Which model a report is about: named (its label and the one name its files in ``data/`` carry),
and never its own twin. Loading is `phaseinterp.load` (`phaseinterp.models.loading`)."""

from __future__ import annotations

from pathlib import Path
from typing import Union

from phaseinterp import zoo
from phaseinterp._checks import check_device
from phaseinterp.errors import UserInputError
from phaseinterp.models import loading
from phaseinterp.models.loading import peek
from phaseinterp.models.protocol import model_label as label


def as_model(model_or_name, device=None):
    """A model object as is (eval mode; ``device`` is for loading only), else `phaseinterp.load`
    of the zoo name or checkpoint folder on ``device``: what the report's functions take."""
    device = check_device(device)
    if not isinstance(model_or_name, (str, Path)):
        return model_or_name.eval()
    return loading.load(model_or_name, device=device)


def check_twin(model, twin) -> None:
    """A ValueError when ``twin`` is ``model`` itself (the same object, zoo name or checkpoint folder)."""
    if twin is None:
        return
    if twin is model or (isinstance(model, (str, Path)) and isinstance(twin, (str, Path))
                         and _model_path(model) == _model_path(twin)):
        raise UserInputError(f"twin={str(twin) if isinstance(twin, (str, Path)) else type(twin).__name__!r} is the "
                         "model itself: a model is never its own twin; pass its full-attention twin (the zoo's "
                         "compressed models: 'full') or twin=None")
    _check_twin_backbone(model, twin)


# What a full-attention twin shares with its model: everything but the compression (TWIN_SAME).
TWIN_SAME = ("d_vocab", "n_layers", "d_model", "n_heads", "d_head", "n_kv_heads", "d_mlp")


def _check_twin_backbone(model, twin) -> None:
    """A twin is the full-attention model of the same backbone: uncompressed, with the model's
    `TWIN_SAME` fields; read from the configs (no weights), skipped where a config cannot be read or is
    not a phaseinterp `CompressedConfig` (a DeepSeek-V4 folder)."""
    def cfg_of(value):
        described = peek(value) if isinstance(value, (str, Path)) else value
        cfg = getattr(described, "cfg", None)
        return cfg if hasattr(cfg, "is_compressed") and all(hasattr(cfg, k) for k in TWIN_SAME) else None

    shown = str(twin) if isinstance(twin, (str, Path)) else type(twin).__name__
    twin_cfg, model_cfg = cfg_of(twin), cfg_of(model)
    if twin_cfg is None:
        return
    if twin_cfg.is_compressed:
        raise UserInputError(f"twin={shown!r} is a compressed model ({twin_cfg.label}): a twin is the full-attention "
                             "model of the same backbone (compression=None), e.g. the zoo's 'full'")
    if model_cfg is None:
        return
    differ = [f"{k} {getattr(model_cfg, k)} vs {getattr(twin_cfg, k)}" for k in TWIN_SAME
              if getattr(model_cfg, k) != getattr(twin_cfg, k)]
    if differ:
        raise UserInputError(f"twin={shown!r} is not the model's full-attention twin: its backbone differs "
                             f"({'; '.join(differ)}); pass the uncompressed model of the same backbone")


def _model_path(name: Union[str, Path]) -> Path:
    path = Path(name)
    if not (path / "config.json").is_file() and (zoo.CHECKPOINT_DIR / str(name)).is_dir():
        path = zoo.CHECKPOINT_DIR / str(name)
    return path.resolve()


def model_label(model) -> str:
    """The model's zoo name or checkpoint folder with its architecture (`protocol.model_label`)."""
    return label(model)


def slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text).strip("_").lower()


def data_name(model) -> str:
    """The one name a model's files in ``data/`` carry: its zoo name, else its config label, as a slug
    (``profile_w4s4_phases.csv``, ``profile_w4s4_staggered_phases.csv``)."""
    return slug(getattr(model, "metadata", {}).get("zoo_name") or getattr(model.cfg, "label", type(model).__name__))
