"""Errors by kind: what the user passed is wrong (`UserInputError`), as opposed to a bug.

`UserInputError` subclasses ValueError, so ``except ValueError`` keeps catching bad input;
the command line reports it (and missing files, unreadable checkpoints) in one line with
exit code 2, and lets every other exception keep its traceback.
"""

from __future__ import annotations


class UserInputError(ValueError):
    """A value the user passed is outside what the call accepts; the message names the value and
    the valid range (``layer=31 is out of range for a 12-layer model (0..11)``)."""


__all__ = ["UserInputError"]
