"""Errors by kind: what the user passed is wrong (`UserInputError`), as opposed to a bug.

`UserInputError` subclasses ValueError, so ``except ValueError`` keeps catching bad input;
`EngineError` is a model server that cannot answer (a RuntimeError);
the command line reports both (and missing files, unreadable checkpoints) in one line with
exit code 2, and lets every other exception keep its traceback. `renamed` keeps an old public name
for one release as an alias that emits a `DeprecationWarning` naming the new one; `keyword_options`
keeps, for one release, a call that passes an option made keyword-only in 0.3 by position.
"""

from __future__ import annotations

import functools
import inspect
import warnings
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


def keyword_options(*old_order: str) -> Callable:
    """Options that 0.3 made keyword-only (the convention: a function's subject is positional, the model
    and what the call is about, every option is keyword-only). A call that still passes them by
    position, in their old order after the function's positional parameters, runs as before for one
    release with a `DeprecationWarning` naming each as a keyword (``n_per_residue=72``). The public
    signature is the new one (``inspect.signature`` follows ``__wrapped__``)."""

    def wrap(fn: Callable) -> Callable:
        signature = inspect.signature(fn)
        positional = [p.name for p in signature.parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        keyword_only = {p.name for p in signature.parameters.values() if p.kind is p.KEYWORD_ONLY}
        stray = [name for name in old_order if name not in keyword_only]
        if stray:  # internal: a wrong declaration is a bug here, not bad input
            raise TypeError(f"keyword_options{tuple(old_order)} on {fn.__qualname__}: {stray} are not "
                            "keyword-only parameters of it")
        n_positional = len(positional)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if len(args) > n_positional:
                extra = args[n_positional:]
                if len(extra) > len(old_order):
                    raise TypeError(f"{fn.__name__}() takes at most {n_positional + len(old_order)} positional "
                                    f"arguments ({n_positional} from 0.4 on) but {len(args)} were given")
                names = old_order[: len(extra)]
                twice = [name for name in names if name in kwargs]
                if twice:
                    raise TypeError(f"{fn.__name__}() got multiple values for argument {twice[0]!r}")
                keywords = ", ".join(f"{name}=..." for name in names)
                warnings.warn(f"{fn.__name__}(): passing {', '.join(names)} by position is deprecated since "
                              f"phaseinterp 0.3 and will be removed in {REMOVED_IN}: pass {keywords}",
                              DeprecationWarning, stacklevel=2)
                kwargs.update(zip(names, extra))
                args = args[:n_positional]
            return fn(*args, **kwargs)

        call.__keyword_options__ = tuple(old_order)
        return call

    return wrap


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


__all__ = ["MissingPathError", "EngineError", "UserInputError", "applies_only", "when_given", "keyword_options", "renamed",
           "warn_renamed"]
