"""Errors by kind: what the user passed is wrong (`UserInputError`), as opposed to a bug.

`UserInputError` subclasses ValueError, so ``except ValueError`` keeps catching bad input;
`EngineError` is a model server that cannot answer (a RuntimeError);
the command line reports both (and missing files, unreadable checkpoints) in one line with
exit code 2, and lets every other exception keep its traceback. `renamed` keeps an old public name
for one release as an alias that emits a `DeprecationWarning` naming the new one.
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable


class UserInputError(ValueError):
    """A value the user passed is outside what the call accepts; the message names the value and
    the valid range (``layer=31 is out of range for a 12-layer model (0..11)``)."""


class EngineError(RuntimeError):
    """An engine (a model server) could not answer: unreachable, timed out, or failing after every
    retry. The message names the server and, from `phase_profile`, how many answers were kept and
    where; the command line reports it in one line with exit code 2."""


class MissingPathError(UserInputError, FileNotFoundError):
    """A path the user gave does not exist (or lacks a file the reader needs): both a
    `UserInputError` and a ``FileNotFoundError``, so either ``except`` catches it."""


# ------------------------------------------------ old public names, kept for one release (0.3)
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


__all__ = ["MissingPathError", "EngineError", "UserInputError", "renamed", "warn_renamed"]
