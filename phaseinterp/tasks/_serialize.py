"""Round-tripping task settings through plain dicts (stored beside checkpoints)."""

from __future__ import annotations

import base64
import dataclasses
import zlib
from typing import Any

import numpy as np

from phaseinterp._checks import plain_number
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


def pack_tokens(tokens: Any) -> dict[str, Any]:
    """Token ids as a compact JSON value: ``{"dtype": "uint16" | "uint32", "n": count, "zlib_base64": ...}``
    (a held-out corpus of a million tokens is about 0.9 MB this way, 7 MB as a JSON list). `unpack_tokens`
    reads it back, and plain lists too."""
    ids = np.asarray(tokens, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= 2**32):
        raise UserInputError(f"token ids must lie in 0..{2**32 - 1} to be stored (found {ids.min()}..{ids.max()})")
    dtype = "uint16" if not ids.size or ids.max() < 2**16 else "uint32"
    payload = zlib.compress(ids.astype(f"<{'u2' if dtype == 'uint16' else 'u4'}").tobytes(), 6)
    return {"dtype": dtype, "n": int(ids.size), "zlib_base64": base64.b64encode(payload).decode("ascii")}


def unpack_tokens(value: Any, name: str = "text") -> tuple[int, ...]:
    """The token ids of `pack_tokens`'s value, or of a plain list (as older files store them)."""
    if not isinstance(value, dict):
        return tuple(value)
    try:
        dtype = {"uint16": "<u2", "uint32": "<u4"}[value["dtype"]]
        ids = np.frombuffer(zlib.decompress(base64.b64decode(value["zlib_base64"])), dtype=dtype)
    except (KeyError, TypeError, ValueError, zlib.error) as error:
        raise UserInputError(f"{name}: not a stored token list ({type(error).__name__}: {error})") from None
    if ids.size != value.get("n"):
        raise UserInputError(f"{name}: the stored token list holds {ids.size} ids, its header says {value.get('n')}")
    return tuple(ids.tolist())


class TaskSettings:
    """What the task dataclasses share (declare them ``@dataclass(frozen=True, repr=False)``):
    a settings-table repr and the dict round trip stored beside checkpoints."""

    def __repr__(self) -> str:  # a settings table: never the whole vocabulary
        return settings_repr(self)

    def _repr_html_(self) -> str:
        return settings_repr_html(self)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d = {name: [plain_number(v) for v in value] if isinstance(value, tuple) else plain_number(value)
             for name, value in d.items()}
        d["vocab"] = self.vocab.to_dict()
        return {"kind": type(self).__name__, **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        return task_from_fields(cls, d)
