"""Errors by kind: what the user passed is wrong (`UserInputError`), as opposed to a bug.

`UserInputError` subclasses ValueError, so ``except ValueError`` keeps catching bad input;
`EngineError` is a model server that cannot answer (a RuntimeError);
the command line reports both (and missing files, unreadable checkpoints) in one line with
exit code 2, and lets every other exception keep its traceback. `applies_only` refuses an option that
cannot apply to a call, naming why.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable


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


def applies_only(options: tuple[str, ...], *, unless: Callable[[dict], str | None]) -> Callable:
    """Refuse options that cannot apply to the call: when ``unless(arguments)`` (the call's bound
    arguments, defaults not filled in) returns a reason, any of ``options`` passed explicitly raises a
    one-line `UserInputError` naming it, its value and the reason, before the function runs. An option
    left at its default is never blamed."""

    def wrap(fn: Callable) -> Callable:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            passed = [name for name in options if name in kwargs]
            if passed:
                why = unless(signature.bind_partial(*args, **kwargs).arguments)
                if why:
                    name = passed[0]
                    raise UserInputError(f"{name}={kwargs[name]!r} does not apply here: {why}; drop {name}=")
            return fn(*args, **kwargs)

        call.__applies_only__ = tuple(options)
        return call

    return wrap


def when_given(name: str, why: str) -> Callable[[dict], str | None]:
    """An `applies_only` condition: ``why`` when the call passes ``name`` (not None)."""
    return lambda arguments: why if arguments.get(name) is not None else None


__all__ = ["MissingPathError", "EngineError", "UserInputError", "applies_only", "when_given"]
