"""Errors by kind: what the user passed is wrong (`UserInputError`), as opposed to a bug.

`UserInputError` subclasses ValueError, so ``except ValueError`` keeps catching bad input;
`EngineError` is a model server that cannot answer (a RuntimeError);
the command line reports both (and missing files, unreadable checkpoints) in one line with
exit code 2, and lets every other exception keep its traceback.
"""

from __future__ import annotations


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


__all__ = ["MissingPathError", "EngineError", "UserInputError"]
