"""One protocol for every result object, and one on-disk format.

Every result class is a frozen dataclass inheriting `Result`: ``to_dict()`` (headline numbers,
JSON-ready), ``summary()`` (the same as a rounded table), ``to_frame()`` (tidy rows), ``plot()``,
``save(dir)`` / ``cls.load(dir)`` (``meta.json``, strict JSON, + ``arrays.npz``, no pickles, written
atomically; a list of results in ``dir/<field>/<i>/``), a short ``repr`` and ``_repr_html_``, and ``==``
by content. Imports only numpy, pandas, jaxtyping and the file helpers; `plotting` loads plotly lazily."""

from __future__ import annotations

import collections.abc
import dataclasses
import hashlib
import html
import io
import json
import math
import os
import types
import typing
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import pandas as pd
from jaxtyping import AbstractArray

from phaseinterp.errors import MissingPathError, UserInputError
from phaseinterp._files import (RESULT_KIND, atomic_write, check_read_path, check_write_target, saved_kind,
                                write_dir_atomically)

FORMAT = 1
META_FILE = "meta.json"
ARRAYS_FILE = "arrays.npz"
_REPR_ROWS = 14  # a repr shows at most this many summary rows
_CELL_CHARS = 70  # ... and cuts longer cells



def plotting() -> types.ModuleType:
    """The figures, `phaseinterp.plot`, imported by the first ``plot()`` of any result: plotly takes
    over a second to import, and the models, tasks and experiments run without it."""
    import phaseinterp.plot

    return phaseinterp.plot


_PLOTLY_JS_SENT = False


def _plotly_js():
    """How `_repr_html_` ships plotly.js: inline (offline-safe) in the first figure of this Python
    process, then not again (later figures on the same page reuse it, as plotly's own offline
    notebook mode does). ``PHASEINTERP_PLOTLYJS=cdn`` loads it from the CDN in every figure instead."""
    global _PLOTLY_JS_SENT
    mode = os.environ.get("PHASEINTERP_PLOTLYJS", "inline")
    if mode not in ("inline", "cdn"):
        raise UserInputError(f"PHASEINTERP_PLOTLYJS={mode!r} is not one of 'inline', 'cdn'")
    if mode == "cdn":
        return "cdn"
    if _PLOTLY_JS_SENT:
        return False
    _PLOTLY_JS_SENT = True
    return True


PREMISE_FAILS = "PREMISE FAILS"


def premise_entries(notes) -> dict[str, Any]:
    """The two entries a result's ``to_dict()`` / ``summary()`` carries about its premise:
    ``premise`` ("holds" or "PREMISE FAILS") and ``premise_notes`` (the sentences; empty when it holds)."""
    notes = [str(n) for n in notes]
    return {"premise": PREMISE_FAILS if notes else "holds", "premise_notes": notes}


_KINDS: dict[str, type] = {}  # "module.qualname" -> Result subclass, for loading nested results


class Result:
    """Mixin for the frozen result dataclasses (declare them with ``eq=False, repr=False``)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _KINDS[_kind_path(cls)] = cls

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    # ---------------------------------------------------------------- premise
    @property
    def premise_notes(self) -> tuple[str, ...]:
        """One sentence per premise of the experiment that fails (empty: every checked premise holds); the
        numbers stay but are not evidence for the claim. The base reads ``premise_recorded`` (notes recorded
        from the model when it ran); classes add notes derived from their own data."""
        return tuple(getattr(self, "premise_recorded", ()) or ())

    @property
    def premise_holds(self) -> bool:
        """True when no premise check fails (``premise_notes`` is empty)."""
        return not self.premise_notes

    # ---------------------------------------------------------------- reading
    @property
    def _title(self) -> str:
        label = getattr(self, "label", None) or getattr(self, "model_label", None) or ""
        return f"{type(self).__name__}: {label}" if label else type(self).__name__

    def summary(self) -> pd.DataFrame:
        """The headline numbers of ``to_dict()`` as a table: one row per quantity, values
        rounded to 4 significant digits and lists joined for reading (``premise_notes`` in full,
        and present whenever a premise fails). ``to_dict()`` keeps the full-precision values."""
        entries = self.to_dict()
        if "premise" not in entries and self.premise_notes:
            entries = entries | premise_entries(self.premise_notes)
        # a failed premise is read in full: its sentences are never cut like other cells
        rows = [(key, "; ".join(value) if key == "premise_notes" and value else _readable(value))
                for key, value in entries.items()]
        frame = pd.DataFrame(rows, columns=["quantity", "value"]).set_index("quantity")
        frame.index.name = None  # the row labels name the quantities; no extra header row in HTML
        return frame

    def __repr__(self) -> str:
        table = self.summary()
        more = len(table) - _REPR_ROWS
        text = _two_columns(table.head(_REPR_ROWS))
        lines = [f"<{self._title}>", text]
        if more > 0:
            lines.append(f"... {more} more rows: .summary()")
        lines.append("(.summary() table, .to_frame() rows, .plot() figure, .save(dir))")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        parts = [f"<div><b>{html.escape(self._title)}</b>", self.summary().to_html(border=0)]
        try:
            parts.append(plotting().export.html_fragment(self.plot(), include_plotlyjs=_plotly_js()))
        except Exception as err:  # a figure is a bonus; the table must always render
            parts.append(f"<p><i>figure unavailable: {html.escape(str(err))}</i></p>")
        parts.append("</div>")
        return "\n".join(parts)

    # -------------------------------------------------------------- equality
    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(_equal(getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self))

    __hash__ = None  # contents hold arrays: equal results need not hash alike

    # ------------------------------------------------------------------ files
    def save(self, directory: Union[str, os.PathLike], overwrite: bool = False) -> Path:
        """Write ``directory/meta.json`` + ``directory/arrays.npz``; returns the folder.

        ``directory`` must not exist yet or be empty; a previous result of the same class there is
        replaced only with ``overwrite=True`` (whole and atomically: the new folder is written beside
        it and renamed into place), and nothing else is ever replaced (`check_write_target`)."""
        directory = check_write_target(directory, RESULT_KIND.format(type(self).__name__), overwrite=overwrite)
        return write_dir_atomically(directory, self._write)

    def _write(self, directory: Path) -> None:
        """Write the two files (and nested results' folders) into the new folder ``directory``."""
        meta: dict[str, Any] = {"kind": type(self).__name__, "format": FORMAT, "fields": {}, "arrays": [],
                                "frames": {}, "results": {}}
        arrays: dict[str, np.ndarray] = {}
        for f in dataclasses.fields(self):
            if not f.init:
                continue
            value = getattr(self, f.name)
            if _is_result_list(value):
                # Nested results (runs of different lengths) keep their own folders: no padding.
                for i, item in enumerate(value):
                    (directory / f.name / str(i)).mkdir(parents=True)
                    item._write(directory / f.name / str(i))
                meta["results"][f.name] = {"kinds": [_kind_path(type(item)) for item in value],
                                           "tuple": isinstance(value, tuple)}
            elif isinstance(value, np.ndarray):
                arrays[f.name] = _array_for_npz(value, f.name)
                meta["arrays"].append(f.name)
            elif isinstance(value, pd.DataFrame):
                meta["frames"][f.name] = _frame_to_arrays(value, f.name, arrays)
            else:
                meta["fields"][f.name] = _encode(value)
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        blob = buf.getvalue()
        meta["content_sha256"] = _content_hash(meta, blob)
        atomic_write(directory / ARRAYS_FILE, blob)
        atomic_write(directory / META_FILE, json.dumps(meta, indent=1, allow_nan=False).encode())

    @classmethod
    def load(cls, directory: Union[str, os.PathLike]):
        """Read a folder written by ``save``; raises FileNotFoundError when a file is missing and
        ValueError when it is truncated, corrupt or holds another kind of result."""
        directory = check_read_path(directory, f"a saved {cls.__name__} folder ({META_FILE} + {ARRAYS_FILE})",
                                    name="directory")
        for name in (META_FILE, ARRAYS_FILE):
            if not (directory / name).is_file():
                held = saved_kind(directory)
                raise MissingPathError(f"{directory / name} does not exist: {str(directory)!r} holds {held}, not a saved "
                                       f"{cls.__name__} (written by its .save(dir))")
        try:
            meta = json.loads((directory / META_FILE).read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise UserInputError(f"{directory / META_FILE} is truncated or corrupt: {err}") from None
        if not isinstance(meta, dict) or meta.get("kind") != cls.__name__:
            kind = meta.get("kind") if isinstance(meta, dict) else None
            raise UserInputError(f"{directory} does not hold a {cls.__name__} (kind={kind!r})")
        if meta.get("format") != FORMAT:
            raise UserInputError(f"{directory / META_FILE}: unsupported format {meta.get('format')!r} (expected {FORMAT})")
        recorded = meta.get("content_sha256")
        if recorded is not None and recorded != _content_hash(meta, (directory / ARRAYS_FILE).read_bytes()):
            raise UserInputError(f"{directory} was changed after it was saved: {META_FILE} and {ARRAYS_FILE} no "
                                 "longer match the SHA-256 recorded when it was written (save the result again)")
        try:
            with np.load(directory / ARRAYS_FILE, allow_pickle=False) as data:
                stored = {k: data[k] for k in data.files}
        except Exception as err:  # zipfile.BadZipFile, ValueError, OSError, EOFError ...
            raise UserInputError(f"{directory / ARRAYS_FILE} is truncated or corrupt: {err}") from None
        for key, kind in (("fields", dict), ("arrays", list), ("frames", dict), ("results", dict)):
            if not isinstance(meta.get(key, {} if key == "results" else None), kind):
                raise UserInputError(f"{directory / META_FILE}: {key!r} is {type(meta.get(key)).__name__}, not a "
                                     f"{kind.__name__}; the saved result was edited or is corrupt")
        kwargs: dict[str, Any] = {}
        for name, value in meta["fields"].items():
            try:
                kwargs[name] = _decode(value)
            except (TypeError, ValueError, KeyError, AttributeError) as err:
                raise UserInputError(f"{directory / META_FILE}: field {name!r} holds an unreadable value "
                                     f"({str(err)[:120]}); the saved result was edited or is corrupt") from None
        try:
            for name in meta["arrays"]:
                kwargs[name] = stored[name]
            for name, spec in meta["frames"].items():
                try:
                    kwargs[name] = _frame_from_arrays(spec, name, stored)
                except KeyError:
                    raise
                except (TypeError, ValueError, AttributeError, IndexError) as err:
                    raise UserInputError(f"{directory}: the table {name!r} does not read back ({str(err)[:120]}); "
                                         "the saved result was edited or is corrupt") from None
        except (KeyError, TypeError) as err:
            raise UserInputError(f"{directory / ARRAYS_FILE} lacks the array {err}: truncated or corrupt") from None
        for name, spec in meta.get("results", {}).items():
            items = []
            kinds = spec.get("kinds") if isinstance(spec, dict) else None
            if not isinstance(kinds, list):
                raise UserInputError(f"{directory / META_FILE}: results entry {name!r} has no list of kinds; the "
                                     "saved result was edited or is corrupt")
            for i, kind in enumerate(kinds):
                if not isinstance(kind, str) or kind not in _KINDS:
                    raise UserInputError(f"{directory / name / str(i)} holds a {kind}, not a known result class")
                items.append(_KINDS[kind].load(directory / name / str(i)))
            kwargs[name] = tuple(items) if spec.get("tuple") else items
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise UserInputError(f"{directory} was saved by another version of {cls.__name__} (unknown fields {unknown})")
        required = [f.name for f in dataclasses.fields(cls) if f.init and f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING]
        missing = [name for name in required if name not in kwargs]
        if missing:
            raise UserInputError(f"{directory} lacks the field(s) {missing} of a {cls.__name__}; the saved result was "
                                 "edited or is corrupt")
        check_loaded_types(cls, kwargs, f"{directory}")
        check_loaded_ranges(kwargs, f"{directory}")
        try:
            return cls(**kwargs)
        except (TypeError, ValueError, IndexError) as err:
            if isinstance(err, UserInputError):
                raise UserInputError(f"{directory}: {' '.join(str(err).split())}") from None
            first = (str(err).strip().splitlines() or [""])[0]
            raise UserInputError(f"{directory} does not make a {cls.__name__} ({type(err).__name__}: "
                                 f"{first[:160]}); the saved result was edited or is corrupt") from None


def _content_hash(meta: dict, arrays_blob: bytes) -> str:
    """SHA-256 of a saved result's contents: its meta.json entries (but this hash) and its arrays file."""
    body = {k: v for k, v in meta.items() if k != "content_sha256"}
    h = hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=False).encode())
    h.update(arrays_blob)
    return h.hexdigest()


# Field names by what they hold, shared by every result class (`_range_of`).
_OPEN_UNIT = ("confidence", "alpha")  # a level strictly between 0 and 1
_P_VALUES = ("identification_p", "nomination_p", "nomination_p_same_units")
_FRACTIONS = ("mean", "chance", "threshold")
_SIZES = ("modulus", "residue_modulus", "stride", "window", "cut_period", "top_k", "max_phases", "eval_every",
          "seq_len")  # a grid or a setting that is at least 1
_COUNTS = ("steps",)


def _range_of(name: str) -> Optional[tuple[float, float, str]]:
    """The values a field of this name can hold, by the names every result shares."""
    if name in _OPEN_UNIT:
        return (0.0, 1.0, "in (0, 1)")
    if ("p_value" in name or "accuracy" in name or name.endswith(("_lower", "_upper", "_rate", *_P_VALUES))
            or "_rate_" in name or name in _FRACTIONS):
        return (0.0, 1.0, "in [0, 1]")
    if name in _SIZES:
        return (1.0, math.inf, "a size >= 1")
    if name.endswith(("_n", "_correct")) or name.startswith("n_") or name in _COUNTS:
        return (0.0, math.inf, "a count >= 0")
    return None


def _fits(value: Any, hint: Any) -> bool:
    """Whether a loaded ``value`` can be of the annotated type ``hint`` (a readable subset of typing:
    what no check here understands passes)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or isinstance(hint, (str, typing.TypeVar)):
        return True
    if origin is Union or (hasattr(types, "UnionType") and isinstance(hint, types.UnionType)):
        return any(_fits(value, a) for a in args)
    if hint is type(None):
        return value is None
    if origin is typing.Literal:
        return value in args
    if hint is bool:
        return isinstance(value, (bool, np.bool_))
    if hint is int:
        return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if hint is float:
        return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    if hint is str:
        return isinstance(value, str)
    if origin in (tuple, list, collections.abc.Sequence):
        if not isinstance(value, (tuple, list)) or any(isinstance(v, Result) for v in value):
            return isinstance(value, (tuple, list))
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(_fits(v, a) for v, a in zip(value, args))
        return not args or all(_fits(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if isinstance(hint, type) and issubclass(hint, AbstractArray):  # Float[np.ndarray, "residue"], ...
        if not isinstance(value, np.ndarray):
            return False
        dims = hint.dim_str.split()
        if not any(d.startswith(("*", "...", "#")) or d == "..." for d in dims) and value.ndim != len(dims):
            return False
        return value.dtype.name in hint.dtypes or (hint.dtype.__name__ == "Float" and value.dtype.kind in "iu")
    if hint in (np.ndarray, pd.DataFrame, tuple, list, dict):
        return isinstance(value, hint)
    return True


def _type_text(hint: Any) -> str:
    if isinstance(hint, type) and issubclass(hint, AbstractArray):
        return f"a {hint.dtype.__name__} array [{hint.dim_str}]"
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def check_loaded_types(cls: type, fields: dict, where: str) -> None:
    """Refuse a loaded field whose value is not of its annotated type (a string for a count, a list for a
    p-value, a 2-D array for a per-residue one, null for a field that cannot be None), naming it."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # an annotation this Python cannot evaluate: nothing to check against
        return
    sizes: dict[str, tuple[str, int]] = {}  # a named axis ("residue") -> the first field that has it, its size
    for name, value in fields.items():
        hint = hints.get(name)
        if hint is not None and not _fits(value, hint):
            shown = f"an array of {value.dtype} {value.shape}" if isinstance(value, np.ndarray) else repr(value)[:60]
            raise UserInputError(f"{where}: {name}={shown} is not {_type_text(hint)}; the saved result was edited "
                                 "or is corrupt")
        if isinstance(value, np.ndarray) and isinstance(hint, type) and issubclass(hint, AbstractArray):
            dims = hint.dim_str.split()
            for axis, dim in enumerate(dims if value.ndim == len(dims) else ()):
                if not dim.isidentifier() or dim == "_":
                    continue
                first, size = sizes.setdefault(dim, (name, value.shape[axis]))
                if size != value.shape[axis]:
                    raise UserInputError(f"{where}: {name} has {value.shape[axis]} entries along {dim!r} but {first} "
                                         f"has {size}; the saved result was edited or is corrupt")


def check_loaded_ranges(fields: dict, where: str) -> None:
    """Refuse a loaded field whose value it cannot have (a p-value of 7, a confidence of -3, a negative
    count, a stride of 0, more correct answers than prompts, more hits than nominations), naming the
    field and its range (`_range_of`, by the field names every result shares). NaN is allowed (not
    measured)."""
    for name, value in fields.items():
        bounds = _range_of(name)
        if bounds is None or isinstance(value, (str, bool)) or value is None:
            continue
        try:
            values = np.asarray(value, dtype=float)
        except (TypeError, ValueError):
            continue
        low, high, text = bounds
        finite = values[~np.isnan(values)]
        bad = (finite < low) | (finite > high)
        if name in _OPEN_UNIT:
            bad |= (finite <= 0) | (finite >= 1)
        if bad.any():
            shown = float(finite[bad].ravel()[0])
            raise UserInputError(f"{where}: {name}={shown!r} is out of range ({text}); the saved result was edited "
                                 "or is corrupt")
    for name, value in fields.items():
        if name.endswith("_correct") and name.replace("_correct", "_n") in fields:
            n = np.asarray(fields[name.replace("_correct", "_n")], dtype=float)
            c = np.asarray(value, dtype=float)
            if c.shape == n.shape and (c > n).any():
                raise UserInputError(f"{where}: {name} exceeds {name.replace('_correct', '_n')} (more correct answers "
                                     "than prompts); the saved result was edited or is corrupt")
    for part, whole, what in (("n_hits", "n_nominated", "more hits than nominated units"),):
        if isinstance(fields.get(part), (int, np.integer)) and isinstance(fields.get(whole), (int, np.integer)) \
                and fields[part] > fields[whole]:
            raise UserInputError(f"{where}: {part}={int(fields[part])} exceeds {whole}={int(fields[whole])} ({what}); "
                                 "the saved result was edited or is corrupt")


# ------------------------------------------------------- tasks and settings
def settings_frame(obj: Any) -> pd.DataFrame:
    """A dataclass's fields as a two-column table (setting, value), long values summarised
    (a vocabulary or a token pool shows its size, never its contents)."""
    rows = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        text = repr(value)
        if len(text) > _CELL_CHARS:
            if hasattr(value, "__len__") and not isinstance(value, str):
                text = f"<{type(value).__name__} of {len(value)} items>"
            else:
                text = text[: _CELL_CHARS - 3] + "..."
        rows.append((f.name, text))
    return pd.DataFrame(rows, columns=["setting", "value"]).set_index("setting")


def settings_repr(obj: Any) -> str:
    """Short text repr of a task or settings dataclass: its name and a settings table."""
    return f"<{type(obj).__name__}>\n" + _two_columns(settings_frame(obj))


def _two_columns(frame: pd.DataFrame) -> str:
    width = max((len(str(k)) for k in frame.index), default=0)
    return "\n".join(f"  {str(k):<{width}}  {v}" for k, v in zip(frame.index, frame.iloc[:, 0]))


def settings_repr_html(obj: Any) -> str:
    return f"<div><b>{html.escape(type(obj).__name__)}</b>" + settings_frame(obj).to_html(border=0) + "</div>"


# ---------------------------------------------------------------- encoding
def _kind_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _is_result_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(v, Result) for v in value)


def _scalar(value: Any) -> Any:
    """A numpy bool, integer or float as Python's; anything else as it is."""
    return value.item() if isinstance(value, (np.bool_, np.integer, np.floating)) else value


def _readable(value: Any) -> Any:
    value = _scalar(value)
    if isinstance(value, int):  # bool included
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"  # undefined (e.g. an R² over constant accuracies)
        return value if math.isinf(value) or value == 0 else float(f"{value:.4g}")
    if value is None:
        return "none"
    if isinstance(value, dict):
        text = ", ".join(f"{k}: {_readable(v)}" for k, v in value.items())
    elif isinstance(value, (list, tuple, np.ndarray)):
        text = ", ".join(str(_readable(v)) for v in value) if len(value) else "none"
    else:
        text = str(value)
    return text if len(text) <= _CELL_CHARS else text[: _CELL_CHARS - 3] + "..."


def _encode(value: Any) -> Any:
    """Strict-JSON form of a field value; tagged where JSON would lose the type."""
    value = _scalar(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if value is None or isinstance(value, (str, int)):  # bool included
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {"__dict__": {k: _encode(v) for k, v in value.items()}}
        return {"__items__": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if isinstance(value, np.ndarray):
        return {"__ndarray__": [_encode(v) for v in value.tolist()], "dtype": str(value.dtype)}
    raise TypeError(f"cannot store a {type(value).__name__} in meta.json")


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "__float__" in value:
        return float(value["__float__"])
    if "__tuple__" in value:
        return tuple(_decode(v) for v in value["__tuple__"])
    if "__dict__" in value:
        return {k: _decode(v) for k, v in value["__dict__"].items()}
    if "__items__" in value:
        return {_decode(k): _decode(v) for k, v in value["__items__"]}
    if "__ndarray__" in value:
        return np.asarray(_decode(value["__ndarray__"]), dtype=value["dtype"])
    raise UserInputError(f"unknown tagged value in meta.json: {sorted(value)}")


def _array_for_npz(value: np.ndarray, name: str) -> np.ndarray:
    if value.dtype == object:
        raise TypeError(f"field {name!r} is an object array; store it as a table or a numeric array")
    return value


def _frame_to_arrays(frame: pd.DataFrame, name: str, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """Store each column as ``arrays['<name>/<i>']``; returns the column spec for meta.json."""
    index_names = None
    if not isinstance(frame.index, pd.RangeIndex) or frame.index.start != 0 or frame.index.step != 1:
        index_names = [n if n is not None else f"level_{i}" for i, n in enumerate(frame.index.names)]
        frame = frame.reset_index()
        frame.columns = [*index_names, *frame.columns[len(index_names):]]
    columns = []
    for i, column in enumerate(frame.columns):
        values = frame[column]
        kind = "plain"
        if isinstance(values.dtype, pd.CategoricalDtype):
            values = values.astype(str)
        if values.dtype.kind in "biufcmM":
            data = values.to_numpy()
        else:
            cells = values.to_list()
            if all(isinstance(c, str) for c in cells):
                data, kind = np.asarray(cells, dtype=str), "str"
            else:
                kind = "tuple" if cells and all(isinstance(c, tuple) for c in cells) else "json"
                data = np.asarray([json.dumps(_encode(c), allow_nan=False) for c in cells], dtype=str)
        arrays[f"{name}/{i}"] = data.reshape(len(frame))
        columns.append({"name": _encode(column), "kind": kind})
    return {"columns": columns, "index": index_names, "columns_name": _encode(frame.columns.name)}


def _frame_from_arrays(spec: dict[str, Any], name: str, stored: dict[str, np.ndarray]) -> pd.DataFrame:
    data = {}
    for i, column in enumerate(spec["columns"]):
        values = stored[f"{name}/{i}"]
        if column["kind"] == "str":
            values = values.astype(object)
        elif column["kind"] in ("json", "tuple"):
            cells = [_decode(json.loads(c)) for c in values.tolist()]
            if column["kind"] == "tuple":
                cells = [tuple(c) for c in cells]
            values = pd.Series(cells, dtype=object).to_numpy()
        data[i] = values
    frame = pd.DataFrame(data)
    frame.columns = [_decode(c["name"]) for c in spec["columns"]]
    if spec.get("index"):
        frame = frame.set_index(spec["index"])
    frame.columns.name = _decode(spec.get("columns_name"))
    return frame


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, pd.DataFrame) or isinstance(b, pd.DataFrame):
        if not (isinstance(a, pd.DataFrame) and isinstance(b, pd.DataFrame)):
            return False
        try:
            pd.testing.assert_frame_equal(a, b, check_dtype=False, check_exact=True, check_column_type=False,
                                          check_index_type=False)
        except AssertionError:
            return False
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return False
        if a.dtype.kind in "fc" or b.dtype.kind in "fc":
            return bool(np.array_equal(a, b, equal_nan=True))
        return bool(np.array_equal(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return bool(a == b)


def strict_json(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSON ``null``), numpy values as Python
    values: ``json.dumps(strict_json(x), allow_nan=False)`` never writes ``NaN``."""
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, str) else k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    if isinstance(value, np.ndarray):
        return [strict_json(v) for v in value.tolist()]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, pd.DataFrame):
        return strict_json(value.to_dict(orient="records"))
    return value


def dumps(value: Any, **kwargs) -> str:
    """Strict JSON text of ``value`` (see `strict_json`)."""
    return json.dumps(strict_json(value), allow_nan=False, **kwargs)


__all__ = ["FORMAT", "Result", "dumps", "settings_frame", "settings_repr", "settings_repr_html", "strict_json"]
