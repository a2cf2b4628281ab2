"""Round-tripping task settings through plain dicts (stored beside checkpoints)."""

from __future__ import annotations

import dataclasses
from typing import Any

from phaseinterp.tasks.vocab import Vocab


def task_from_fields(cls, d: dict[str, Any]):
    """``cls(**d)`` for a task dataclass, checking ``kind`` and unknown fields, rebuilding the Vocab."""
    d = dict(d)
    kind = d.pop("kind", cls.__name__)
    if kind != cls.__name__:
        raise ValueError(f"kind={kind!r} is not {cls.__name__!r}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - known
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields {sorted(unknown)}; valid fields: {sorted(known)}")
    if "vocab" in d:
        d["vocab"] = Vocab.from_dict(d["vocab"])
    return cls(**d)
