"""Old public names kept for one release (0.3) as aliases that warn, naming the new one."""

from __future__ import annotations

import functools
import warnings
from typing import Callable

REMOVED_IN = "0.4"


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    warnings.warn(f"{old} is deprecated since phaseinterp 0.3 and will be removed in {REMOVED_IN}: use {new}",
                  DeprecationWarning, stacklevel=stacklevel)


def renamed(old: str, new_name: str, new: Callable) -> Callable:
    """``new`` under its old name ``old``: same signature and behaviour, plus a `DeprecationWarning`
    that names ``new_name``."""

    @functools.wraps(new)
    def alias(*args, **kwargs):
        warn_renamed(old, new_name)
        return new(*args, **kwargs)

    alias.__name__ = alias.__qualname__ = old.rsplit(".", 1)[-1]
    alias.__doc__ = f"Deprecated alias of `{new_name}` (removed in {REMOVED_IN}).\n\n{new.__doc__ or ''}"
    alias.__deprecated_alias_of__ = new_name
    return alias
