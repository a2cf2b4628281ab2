"""Round-tripping task settings through plain dicts (stored beside checkpoints)."""

from __future__ import annotations

import dataclasses
from typing import Any

from phaseinterp.errors import UserInputError
from phaseinterp.results import settings_repr, settings_repr_html
from phaseinterp.tasks.vocab import Vocab


def task_from_fields(cls, d: dict[str, Any]):
    """``cls(**d)`` for a task dataclass, checking ``kind`` and unknown fields, rebuilding the Vocab."""
    d = dict(d)
    kind = d.pop("kind", cls.__name__)
    if kind != cls.__name__:
        raise UserInputError(f"kind={kind!r} is not {cls.__name__!r}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - known
    if unknown:
        raise UserInputError(f"unknown {cls.__name__} fields {sorted(unknown)}; valid fields: {sorted(known)}")
    if "vocab" in d:
        d["vocab"] = Vocab.from_dict(d["vocab"])
    return cls(**d)


class TaskSettings:
    """What the task dataclasses share (declare them ``@dataclass(frozen=True, repr=False)``):
    a settings-table repr and the dict round trip stored beside checkpoints."""

    def __repr__(self) -> str:  # a settings table: never the whole vocabulary
        return settings_repr(self)

    def _repr_html_(self) -> str:
        return settings_repr_html(self)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d = {name: list(value) if isinstance(value, tuple) else value for name, value in d.items()}
        d["vocab"] = self.vocab.to_dict()
        return {"kind": type(self).__name__, **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        return task_from_fields(cls, d)
