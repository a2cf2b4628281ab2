"""A training run's checkpoints: ``root/step_N/`` folders, each complete before it is renamed into place,
``root/LATEST`` naming the newest, and what a resume would change (`changed_fields`)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Optional, Union

from phaseinterp._files import atomic_write
from phaseinterp.errors import UserInputError

STATE_FILE = "train_state.json"  # in every checkpoint: its step and the curves so far


def publish_checkpoint(root: Path, tmp: Path, name: str, *, keep_every: Optional[int] = None) -> None:
    """Rename the complete checkpoint folder ``tmp`` to ``root/name``, point ``root/LATEST`` at it
    (atomic write) and delete every older ``step_*`` but the previous one and, with ``keep_every``, those
    whose step is a multiple of it. A crash at any moment leaves ``LATEST`` naming a complete checkpoint."""
    final = root / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    previous = (root / "LATEST").read_text().strip() if (root / "LATEST").is_file() else None
    atomic_write(root / "LATEST", name.encode())
    for old in root.glob("step_*"):
        kept = keep_every is not None and old.name[5:].isdigit() and int(old.name[5:]) % keep_every == 0
        if old.name not in (name, previous) and not kept:
            shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(root: Union[str, Path]) -> Optional[Path]:
    """The checkpoint directory ``root/LATEST`` names, or None if there is none yet."""
    pointer = Path(root) / "LATEST"
    if not pointer.is_file():
        return None
    path = Path(root) / pointer.read_text().strip()
    if not (path / STATE_FILE).is_file():
        raise UserInputError(f"{pointer} names {path}, which is not a complete checkpoint")
    return path


def changed_fields(old: dict, new: dict, ignore=()) -> str:
    """``"key: old -> new, ..."`` for the keys (``ignore`` aside) whose values differ between two settings
    dicts compared as JSON (a tuple equals its list); "" when none does."""
    old, new = json.loads(json.dumps(old, default=list)), json.loads(json.dumps(new, default=list))
    keys = [k for k in sorted(set(old) | set(new)) if k not in ignore and old.get(k) != new.get(k)]
    return ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys)
