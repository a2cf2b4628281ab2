"""Input checks shared by the experiments and the CLI: each raises a `UserInputError` (a ValueError)
naming the value and the valid range, before any expensive work.

Every experiment is three steps: **spec** (a frozen dataclass of its options, `ProfileSpec`, ...,
whose fields are declared once here with `option`; the CLI's flags are made from them; making one
checks every option, ``spec.check_model(model)`` the checks needing only the model's ``cfg``, and
``spec.check_task(task)`` those needing the task), **records** (one row per prompt) and **result**
(a `phaseinterp.results.Result`). `experiment` makes an experiment function take its spec's fields
as keyword options or a ready ``spec=``, never both."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import difflib
import functools
import inspect
import math
import numbers
import os
import re
import typing
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar, Union

from phaseinterp.errors import UserInputError

MAX_PROMPTS = 500_000  # per call: n_per_residue * R; more would allocate gigabytes of prompts on a laptop

# The one default size, prompts per residue group, of every experiment that measures accuracy by phase: the
# smallest the zoo task (T = 128, R = 24) moment-matches, so ``baseline=phase_profile(model)`` fits every one.
DEFAULT_N_PER_RESIDUE = 72



def check_int(name: str, value: Any, low: int = 1, high: int | None = None, why: str = "") -> int:
    """``value`` as an int if it is an integer (a numpy integer too, never a bool) in ``low..high``
    (``high=None``: no upper bound); else a `UserInputError` naming it and the valid range, with
    ``why`` appended (`` (one chunk makes attention trivial)``). The one integer check of the package."""
    span = f">= {low}" if high is None else f"in {low}..{high}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise UserInputError(f"{name}={plain_number(value)!r} must be an integer {span}{why}")
    value = int(value)
    if value < low or (high is not None and value > high):
        if high is None:
            raise UserInputError(f"{name}={value} must be an integer {span}{why}")
        raise UserInputError(f"{name}={value} is out of range (valid: {low}..{high}){why}")
    return value


SEED_MAX = 2**64 - 1  # torch's generators take a seed in 0..2**64 - 1


def check_seed(name: str, value: Any) -> int:
    """``value`` as an int seed in ``0..SEED_MAX`` (what torch's generators take); else a `UserInputError`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) <= SEED_MAX:
        raise UserInputError(f"{name}={plain_number(value)!r} must be an integer in 0..2**64 - 1 (a seed, as torch's "
                             "generators take)")
    return int(value)


def check_real(name: str, value: Any, low: float = -math.inf, high: float = math.inf, *, low_open: bool = False,
               high_open: bool = True, why: str = "") -> float:
    """``value`` as a Python float if it is a finite real number (a numpy number too, never a bool) in the
    interval from ``low`` to ``high`` (each end closed unless ``low_open``/``high_open``); else a
    `UserInputError` naming it and the interval, with ``why`` appended. The one real-number check."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise UserInputError(f"{name}={plain_number(value)!r} must be a finite number")
    value = float(value)
    if (value <= low if low_open else value < low) or (value >= high if high_open else value > high):
        if math.isinf(high):
            raise UserInputError(f"{name}={value:g} must be {'>' if low_open else '>='} {low:g}{why}")
        left, right = "(" if low_open else "[", ")" if high_open else "]"
        raise UserInputError(f"{name}={value:g} is out of range {left}{low:g}, {high:g}{right}{why}")
    return value


def check_fraction(name: str, value: Any) -> float:
    """``value`` as a float if it is a real number (not a bool) strictly between 0 and 1 (a confidence
    level, a significance level); else a `UserInputError` naming it and the valid range. The one such
    check of the package."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < float(value) < 1:
        raise UserInputError(f"{name}={plain_number(value)!r} must be a number in (0, 1)")
    return float(value)


def check_layer(layer: Any, n_layers: int, name: str = "layer") -> int:
    """``layer`` as an int if it indexes a layer of an ``n_layers``-layer model (``0..n_layers-1``);
    else (a bool, a negative or too large index, a non-integer) a `UserInputError` naming it and the
    valid range: ``layer=31 is out of range for a 12-layer model (0..11)``. The one layer check."""
    if isinstance(layer, bool) or not isinstance(layer, numbers.Integral):
        raise UserInputError(f"{name}={layer!r} is not a layer index (an integer in 0..{n_layers - 1} for a "
                             f"{n_layers}-layer model)")
    if not 0 <= layer < n_layers:
        raise UserInputError(f"{name}={int(layer)} is out of range for a {n_layers}-layer model (0..{n_layers - 1})")
    return int(layer)


def listed(value: Any) -> Any:
    """``value`` as a list where it is one number (a numpy or 0-d tensor one too) or a list, tuple, range,
    1-D numpy array or 1-D tensor of them; anything else unchanged, for the caller's check to name."""
    if hasattr(value, "tolist") and getattr(value, "ndim", 0) <= 1:
        value = value.tolist()
    if isinstance(value, numbers.Number):
        return [value]
    return list(value) if isinstance(value, (list, tuple, range)) else value


def check_indices(name: str, values: Any, low: int, high: int | None = None, *, unit: str, why: str = "",
                  each: Callable[[Any], int] | None = None) -> list[int]:
    """``values`` (one integer or several, as `listed` takes them) as a non-empty list of distinct ints,
    each checked by ``each`` (default: `check_int` in ``low..high`` with ``why``); else a `UserInputError`
    naming ``name``. The one check of the package's lists of indices (layers, KV heads, phases, lengths)."""
    items = listed(values)
    span = f">= {low}" if high is None else f"in {low}..{high}"
    if not isinstance(items, list):
        raise UserInputError(f"{name}={values!r} must be one {unit} ({span}) or a list of them")
    if not items:
        raise UserInputError(f"{name}={values!r} is empty: pass at least one {unit} ({span})")
    out = [each(v) if each else check_int(name, v, low, high, why) for v in items]
    repeated = sorted({v for v in out if out.count(v) > 1})
    if repeated:
        raise UserInputError(f"{name}={out} repeats a {unit} ({', '.join(map(str, repeated))}); list each once")
    return out


def check_tensor(name: str, value: Any, shape: tuple, dtype: Any = None) -> Any:
    """``value`` if it is a floating tensor of ``shape`` (an int: that size; a name: any size >= 1), of
    ``dtype`` where given, every entry finite; else a `UserInputError` naming ``name``, what it must be and
    what came. The one check of a tensor a user hands in (a residual stream, a calibration mean)."""
    import torch

    want = f"a floating tensor [{', '.join(map(str, shape))}]"
    if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.ndim != len(shape) or any(
            value.shape[i] != s if isinstance(s, int) else value.shape[i] == 0 for i, s in enumerate(shape)):
        got = f"{value.dtype} {list(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise UserInputError(f"{name} must be {want}, got {got}")
    if dtype is not None and value.dtype != dtype:
        raise UserInputError(f"{name} has dtype {value.dtype}, the model's is {dtype}: pass it .to({dtype})")
    bad = int((~torch.isfinite(value)).sum())
    if bad:
        raise UserInputError(f"{name} holds {bad} non-finite entries (NaN or inf) of {value.numel()}")
    return value


def plain_number(value: Any) -> Any:
    """A numpy (or other) number as the Python bool, int or float it equals; anything else unchanged. What
    a config or task stores, so it saves as JSON and hashes as the same value given as a Python number."""
    if isinstance(value, numbers.Number) and type(value) not in (bool, int, float) and hasattr(value, "item"):
        return value.item()
    return value


def check_query_chunk(query_chunk: Any) -> Any:
    """``query_chunk`` as the models take it: ``"auto"``, None (no chunking) or an int >= 1 (a numpy
    integer too, as every integer check); else a `UserInputError` naming it. The one check of both
    model families' `set_query_chunk`."""
    if query_chunk is None or (isinstance(query_chunk, str) and query_chunk == "auto"):
        return query_chunk
    if isinstance(query_chunk, bool) or not isinstance(query_chunk, numbers.Integral) or query_chunk < 1:
        raise UserInputError(f"query_chunk={query_chunk!r} must be 'auto', None (no chunking) or an integer >= 1")
    return int(query_chunk)


def closest_names(value: str, choices: Iterable[str], n: int = 3, cutoff: float = 0.6) -> list[str]:
    """The up to ``n`` of ``choices`` nearest ``value`` (difflib, case-insensitive), nearest first."""
    by_lower: dict[str, str] = {}
    for choice in choices:
        by_lower.setdefault(str(choice).lower(), str(choice))
    return [by_lower[c] for c in difflib.get_close_matches(str(value).lower(), list(by_lower), n=n, cutoff=cutoff)]


def check_name(name: str, value: Any, choices: Iterable[Any], *, what: str = "", shown: str | None = None,
               where: str = "", listed: int = 12, n_close: int = 1, cutoff: float = 0.6) -> Any:
    """``value`` if it is one of ``choices``; else a `UserInputError` naming it, the valid choices and the
    nearest ones: ``{shown} is not one of ('a', 'b'); did you mean 'a'?`` (``shown`` defaults to
    ``name=value``), or with more than ``listed`` choices ``{shown} is not {what} (N names, e.g. a, b, c;
    {where})``. ``n_close`` > 1 lists that many near names (``closest: a, b``)."""
    choices = list(choices)
    label = shown if shown is not None else f"{name}={value!r}"
    try:
        if value in choices:
            return value
    except TypeError:  # an unhashable or incomparable value is no name
        pass
    if len(choices) <= listed:
        valid = f"one of {tuple(choices)!r}"
    else:
        examples = ", ".join(str(c) for c in choices[:3])
        valid = f"{what or 'a valid name'} ({len(choices)} names, e.g. {examples}{'; ' + where if where else ''})"
    close = closest_names(value, [str(c) for c in choices], n=n_close, cutoff=cutoff) if isinstance(value, str) else []
    if n_close > 1 and close:
        hint = f"; closest: {', '.join(close)}"
    else:
        hint = f"; did you mean {close[0]!r}?" if close else ""
    raise UserInputError(f"{label} is not {valid}{hint}")


def _spans(values: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` as ``0..2, 5, 7..8``."""
    parts, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            parts.append(str(start) if start == v else f"{start}..{v}")
            start = None
    return ", ".join(parts)


# Set while a sharded run evaluates one chunk of its prompts (`prompt_slices`): a chunk need not hold
# every residue, as the merged records are checked when the result is built from all of them.
_SLICES: contextvars.ContextVar = contextvars.ContextVar("phaseinterp_prompt_slices", default=False)


@contextlib.contextmanager
def prompt_slices():
    """Within this block prompt sets may lack residues (`check_every_residue` passes): for code that runs
    an experiment on slices of a whole prompt set and checks the merged records itself
    (`phaseinterp.parallel`'s chunks)."""
    token = _SLICES.set(True)
    try:
        yield
    finally:
        _SLICES.reset(token)


def check_every_residue(residues: Any, modulus: int, name: str = "prompts") -> None:
    """A `UserInputError` when ``residues`` (one per prompt or record) miss any residue
    ``0..modulus-1`` (a phase would pool only some of its residues), naming the missing residues and how
    to keep every one."""
    import numpy as np

    if _SLICES.get():
        return
    present = set(np.unique(np.asarray(residues, dtype=np.int64) % modulus).tolist())
    missing = [r for r in range(modulus) if r not in present]
    if missing:
        raise UserInputError(
            f"{name} hold prompts of {len(present)} of the {modulus} residues (missing residues {_spans(missing)}): "
            f"accuracy by phase needs every residue mod R={modulus}; to use fewer prompts keep some of each residue, "
            "e.g. batch.subset((batch.meta.groupby('residue').cumcount() < k).to_numpy()), or pass a smaller "
            "n_per_residue")


def check_prompt_batch(batch: Any, name: str = "prompts", every_residue: bool = True) -> Any:
    """``batch`` if it is a non-empty prompt batch (``task.generate(...)``), with at least one prompt of
    every residue where ``every_residue`` (`check_every_residue`); else a `UserInputError` naming ``name``."""
    if not (hasattr(batch, "tokens") and hasattr(batch, "answer_pos") and hasattr(batch, "meta")):
        raise UserInputError(f"{name}={type(batch).__name__} is not a prompt batch (task.generate(n_per_residue))")
    if len(batch) == 0:
        raise UserInputError(f"{name} holds 0 prompts; generate at least one per residue")
    if every_residue:
        check_every_residue(batch.meta["residue"].to_numpy(), int(batch.residue_modulus), name)
    return batch


def check_n_per_residue(value: Any, modulus: int | None = None, name: str = "n_per_residue") -> int:
    """An integer >= 1 whose prompt count ``value * modulus`` stays within `MAX_PROMPTS`."""
    value = check_int(name, value, 1)
    if modulus is None:  # the task (so R) is not known yet: the bound any R allows
        if value > MAX_PROMPTS:
            raise UserInputError(f"{name}={value} asks for more than the {MAX_PROMPTS:,} prompts a call may ask for, "
                                 f"whatever the task's residues R ({name} <= {MAX_PROMPTS:,} / R)")
        return value
    limit = MAX_PROMPTS // modulus
    if value > limit:
        raise UserInputError(
            f"{name}={value} asks for {value * modulus:,} prompts ({modulus} residues); at most "
            f"{MAX_PROMPTS:,} prompts per call are allowed ({name} <= {limit:,} for R={modulus})"
        )
    return value


def _devices_here() -> str:
    """What exists on this machine, for error messages: ``cpu, cuda:0..cuda:1, mps``."""
    import torch

    here = ["cpu"]
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n:
        here.append("cuda:0" if n == 1 else f"cuda:0..cuda:{n - 1}")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        here.append("mps")
    return ", ".join(here)


def check_device(device: Any, name: str = "device"):
    """A ``torch.device`` that exists on this machine; None stays None (the model's own device).

    The one device check of the package: a CPU other than ``cpu``/``cpu:0``, CUDA without it, a GPU
    index beyond the count, or absent MPS is a `UserInputError` naming the argument, the value and what
    exists here."""
    if device is None:
        return None
    import torch

    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise UserInputError(f"{name}={device!r} is not a torch device (e.g. 'cpu', 'cuda', 'cuda:0', 'mps'; "
                             f"this machine has {_devices_here()})")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise UserInputError(f"{name}={device!r} is not a torch device (e.g. 'cpu', 'cuda', 'cuda:0', 'mps'; "
                             f"this machine has {_devices_here()})") from None
    if dev.type == "cpu" and dev.index not in (None, 0):
        raise UserInputError(f"{name}={device!r}: there is one CPU device, 'cpu' (= 'cpu:0'); this machine has "
                             f"{_devices_here()}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UserInputError(f"{name}={device!r}: CUDA is not available on this machine (use 'cpu'; this "
                                 f"machine has {_devices_here()})")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UserInputError(f"{name}={device!r}: this machine has {torch.cuda.device_count()} CUDA device(s) "
                                 f"({_devices_here()})")
    elif dev.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise UserInputError(f"{name}={device!r}: MPS is not available on this machine (this machine has "
                                 f"{_devices_here()})")
    elif dev.type != "cpu":
        raise UserInputError(f"{name}={device!r}: phaseinterp runs on cpu, cuda or mps (this machine has "
                             f"{_devices_here()})")
    return dev


# device_map values transformers/accelerate take besides devices: strategies and offload targets.
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
DEVICE_MAP_OFFLOAD = ("disk",)


def check_device_map(device_map: Any, name: str = "device_map"):
    """``device_map`` as transformers takes it, every device checked by `check_device`: None, a
    strategy (``"auto"``, ``"balanced"``, ``"balanced_low_0"``, ``"sequential"``), one device, or a dict
    module name -> device (``"disk"`` allowed). Anything else is a `UserInputError` naming the argument,
    the entry and what exists, before any weights load."""
    if device_map is None:
        return None
    if isinstance(device_map, str) and device_map in DEVICE_MAP_STRATEGIES:
        return device_map
    if isinstance(device_map, dict):
        if not device_map:
            raise UserInputError(f"{name}={{}} is empty: give module name -> device, or a strategy "
                                 f"({', '.join(DEVICE_MAP_STRATEGIES)})")
        for module, dev in device_map.items():
            if not isinstance(module, str):
                raise UserInputError(f"{name} key {module!r} is not a module name (a string such as 'model.layers.0')")
            if isinstance(dev, str) and dev in DEVICE_MAP_OFFLOAD:
                continue
            check_device(f"cuda:{dev}" if isinstance(dev, int) and not isinstance(dev, bool) and dev >= 0 else dev,
                         name=f"{name}[{module!r}]")
        return device_map
    if isinstance(device_map, int) and not isinstance(device_map, bool):
        check_device(f"cuda:{device_map}" if device_map >= 0 else device_map, name=name)
        return device_map
    if isinstance(device_map, (str,)) or type(device_map).__name__ == "device":
        check_device(device_map, name=name)
        return device_map
    raise UserInputError(f"{name}={device_map!r} is not a device map: None, a strategy ({', '.join(DEVICE_MAP_STRATEGIES)}), "
                         "a device ('cpu', 'cuda:0') or a dict module name -> device")


def check_dtype(dtype: Any, name: str = "dtype", allow_auto: bool = False):
    """A floating ``torch.dtype`` from a dtype or its name as transformers takes it (``"bfloat16"``,
    ``"torch.float16"``, ``"float32"``, ``"half"``); None stays None, and ``"auto"`` stays ``"auto"``
    where ``allow_auto``. Anything else is a `UserInputError` naming the argument and the valid names."""
    import torch

    if dtype is None or (allow_auto and dtype == "auto"):
        return dtype
    if isinstance(dtype, str):
        value = getattr(torch, dtype.removeprefix("torch."), None)
        if isinstance(value, torch.dtype) and value.is_floating_point:
            return value
    elif isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    valid = "torch.float32, torch.bfloat16, torch.float16 or their names ('bfloat16', ...)" + (", 'auto'" if allow_auto else "")
    raise UserInputError(f"{name}={dtype!r} is not a floating torch dtype ({valid})")


def parse_size(value: Union[int, str], what: str = "size") -> int:
    """Bytes from ``1000``, ``"256KB"``, ``"10MiB"``, ``"2GB"`` (KB = 10^3, KiB = 2^10); a UserInputError otherwise."""
    if isinstance(value, bool):
        raise UserInputError(f"{what}={value!r} is not a size (bytes as an int, or e.g. '256KB', '10MiB')")
    if isinstance(value, int):
        n = value
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", str(value), flags=re.IGNORECASE)
        if match is None:
            raise UserInputError(f"{what}={value!r} is not a size (bytes as an int, or e.g. '256KB', '10MiB', '80GB')")
        number, unit = float(match.group(1)), (match.group(2) or "B").upper()
        power = {"B": 0, "K": 1, "M": 2, "G": 3, "T": 4}[unit[0]]
        n = int(number * ((1024 if "I" in unit else 1000) ** power))
    if n <= 0:
        raise UserInputError(f"{what}={value!r} must be a positive number of bytes")
    return n


def check_is_model(model) -> None:
    """A `UserInputError` when ``model`` is a name or a path (a zoo name, a checkpoint folder), not a
    loaded model: experiments take the model object (`phaseinterp.load` makes one)."""
    if isinstance(model, (str, bytes, os.PathLike)):
        raise UserInputError(f"model={model!r} is a {type(model).__name__}, not a model: load it first, e.g. "
                             f"phaseinterp.load({str(model)!r})")


FALSE_WORDS = ("", "0", "false", "no", "off")


def env_flag(name: str) -> bool:
    """An environment switch: on unless unset or one of ``FALSE_WORDS`` (any case), so
    ``PHASEINTERP_NO_PROGRESS=0`` leaves progress bars on."""
    return os.environ.get(name, "").strip().lower() not in FALSE_WORDS


# ------------------------------------------------------------------ an experiment's spec
S = TypeVar("S", bound="Spec")


@dataclasses.dataclass(frozen=True)
class Contains:
    """In an option's ``needs``: the other option must contain this value (``dtypes`` needs ``"dtype" in modes``)."""

    value: Any

    def holds(self, other: Any) -> bool:
        try:
            return self.value in other
        except TypeError:
            return False

    def __repr__(self) -> str:
        return f"a value containing {self.value!r}"


@dataclasses.dataclass(frozen=True)
class OneOf:
    """In an option's ``needs``: the other option must be one of these values (``n_bootstrap`` needs ``interval`` in
    ``("auto", "cluster_bootstrap")``)."""

    values: tuple

    def holds(self, other: Any) -> bool:
        return any(_same(other, v) for v in self.values)

    def __repr__(self) -> str:
        return " or ".join(repr(v) for v in self.values)


def needs_words(other: str, want: Any) -> tuple[str, str]:
    """(the condition, the fix) of a need in words: ``("axis='length'", "pass axis='length'")`` (the
    command line's: `phaseinterp.cli.args.check_flag_needs`)."""
    if isinstance(want, Contains):
        return f"{other} including {want.value!r}", f"add {want.value!r} to {other}"
    if isinstance(want, OneOf):
        return f"{other} {want!r}", f"pass {other}={want.values[0]!r}"
    return f"{other}={want!r}", f"pass {other}={want!r}"


def needs_holds(want: Any, have: Any) -> bool:
    """Whether the value ``have`` of the needed option satisfies ``want`` (an option's ``needs``)."""
    return want.holds(have) if isinstance(want, (Contains, OneOf)) else _same(have, want)


# Where a need is any value given (a command-line flag that is set), not one value.
GIVEN = type("Given", (), {"__repr__": lambda self: "GIVEN"})()


def option(default: Any = None, help: str | None = None, *, parse: str | None = None, choices: tuple | None = None,
           many: bool = False, flag: str | None = None, metavar: str | None = None, needs: tuple = (),
           excludes: tuple | None = None, selects: dict | None = None) -> Any:
    """One option of an options dataclass, declared once: its default and, for the command line, its
    ``help`` (none: Python-only), ``parse`` ("positive", "non_negative", "seed", "positive_float", "ints"; else a
    string), ``choices``, ``many``, ``flag`` (default ``--name``), ``needs`` (``(other, value)`` pairs of
    which one must hold; `Contains`, `OneOf`, `GIVEN`), ``excludes`` (``(other, why)``; ``(other,)``: it
    replaces the other) and ``selects``. Read by `Spec.check_needs` and `phaseinterp.cli.args`."""
    if needs and isinstance(needs[0], str):
        needs = (needs,)
    meta = {"help": help, "parse": parse, "choices": choices, "many": many, "flag": flag, "metavar": metavar,
            "needs": tuple(needs), "excludes": excludes, "selects": selects}
    return dataclasses.field(default=default, metadata={k: v for k, v in meta.items() if v})


def flag_of(field: dataclasses.Field) -> str:
    """The command-line flag of an option (``--n-per-residue``)."""
    return field.metadata.get("flag") or f"--{field.name.replace('_', '-')}"


def dest_of(field: dataclasses.Field) -> str:
    """The parsed argument an option's flag fills (``layers``' ``--layer``: ``layer``)."""
    return flag_of(field)[2:].replace("-", "_")


def cli_fields(cls: Any) -> list[dataclasses.Field]:
    """The options of ``cls`` the command line takes (those declared with help)."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get("help")]


@dataclasses.dataclass(frozen=True)
class Spec:
    """Base of the experiment specs: validation on construction, `check_model`, `check_task`,
    `from_args`, `replace`, `options`. What an option needs to act and what it replaces are declared on
    its field (`option`): one set (not its default) without what it needs would do nothing, so making the
    spec refuses it, naming both; the command line reads the same declarations."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):  # a numpy number as the Python one it equals (results are JSON)
            object.__setattr__(self, field.name, plain_number(getattr(self, field.name)))
        self.check_needs()
        self.validate()
        self.check_declared()

    def check_needs(self) -> None:
        """Refuse an option set (other than its default) whose needs do not hold, or beside the option it
        replaces, naming both options."""
        for field in dataclasses.fields(self):
            name, value = field.name, getattr(self, field.name)
            if value is None or _same(value, _default(field)):
                continue
            needs = field.metadata.get("needs", ())
            if needs and not any(needs_holds(want, getattr(self, other)) for other, want in needs):
                (other, want), have = needs[0], getattr(self, needs[0][0])
                cond, fix = needs_words(other, want)
                raise UserInputError(f"{name}= applies to {cond} only ({other}={have!r} here, where {name}={value!r} "
                                     f"would do nothing); drop {name}= or {fix}")
            excludes = field.metadata.get("excludes")
            if excludes and len(excludes) == 1:
                other = excludes[0]
                replaced = getattr(self, other)
                if not _same(replaced, _default(self.__dataclass_fields__[other])):
                    raise UserInputError(f"{name}={value!r} replaces {other}= ({other}={replaced!r} would be ignored); "
                                         f"pass one of them")

    def check_declared(self) -> None:
        """Each option within its declared choices and range (`option`'s ``choices``; ``parse``
        "positive" / "non_negative": an integer >= 1 / >= 0, or None where None is the default), after
        `validate`'s own words."""
        for field in dataclasses.fields(self):
            name, value, meta = field.name, getattr(self, field.name), field.metadata
            if meta.get("choices") and not meta.get("many") and not any(_same(value, c) for c in meta["choices"]):
                raise UserInputError(f"{name}={value!r} is not one of {meta['choices']}")
            if meta.get("parse") in ("positive", "non_negative") and not (value is None and field.default is None):
                check_int(name, value, int(meta["parse"] == "positive"))
            if meta.get("parse") == "seed" and not (value is None and field.default is None):
                check_seed(name, value)

    def validate(self) -> None:
        """Check every option against the others and where its declaration (`check_declared`) does not
        say enough (no model, no task); a `UserInputError` naming the value and its valid range."""

    def check_model(self, model: Any) -> None:
        """The checks that need the model's config (``model.cfg`` only: a described checkpoint
        from `phaseinterp.models.loading.peek` will do)."""

    def check_task(self, task: Any) -> None:
        """The checks that need the task (a task with ``generate``), before any prompt is made."""

    def _set(self, name: str, value: Any) -> None:
        """Store a normalized value from `validate` (the dataclass is frozen)."""
        object.__setattr__(self, name, value)

    # ------------------------------------------------------------ building one
    @classmethod
    def from_args(cls: type[S], args: Any, **overrides: Any) -> S:
        """The spec of a parsed command line: each option the command line takes from its flag's argument
        (`dest_of`); one left unset (None) keeps the option's default."""
        values = {f.name: getattr(args, dest_of(f), None) for f in cli_fields(cls)}
        return cls(**{**{k: v for k, v in values.items() if v is not None}, **overrides})

    def replace(self: S, **changes: Any) -> S:
        """A copy with ``changes`` applied (and checked again)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise UserInputError(f"{type(self).__name__} has no option {', '.join(unknown)} "
                                 f"(options: {', '.join(f.name for f in dataclasses.fields(self))})")
        return dataclasses.replace(self, **changes)

    def refuse_changed(self, names: tuple[str, ...], why: str) -> None:
        """A `UserInputError` for the first of ``names`` that differs from its default: it cannot apply to
        this call (``why``), as `phaseinterp.errors.applies_only` says of a keyword passed beside it."""
        changed = self.options(changed_only=True)
        for name in names:
            if name in changed:
                raise UserInputError(f"{name}={changed[name]!r} does not apply here: {why}; drop {name}=")

    def options(self, changed_only: bool = False) -> dict[str, Any]:
        """``{option: value}``; ``changed_only``: only those that differ from their defaults."""
        out = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if changed_only and _default(field) is not dataclasses.MISSING and _same(value, _default(field)):
                continue
            out[field.name] = value
        return out


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - arrays and other values without a plain ==
        return a is b


def experiment(spec_type: type[Spec]) -> Callable[[Callable], Callable]:
    """``fn`` as an experiment over ``spec_type``: its keyword options are the spec's fields with the same
    defaults (checked when its module loads), plus ``spec=`` (a ready spec). A call makes the spec from
    the options written, or takes the given one when no option is written beside it (else a
    `UserInputError` naming them), and runs ``fn`` with ``spec=`` and each option as the spec holds it.
    ``fn.__spec_type__`` is ``spec_type``."""

    def mark(fn: Callable) -> Callable:
        signature = inspect.signature(fn)
        if "spec" not in signature.parameters:
            raise TypeError(f"internal: {fn.__name__} must take spec=")
        names = [field.name for field in dataclasses.fields(spec_type)]
        for field in dataclasses.fields(spec_type):
            param = signature.parameters.get(field.name)
            if param is None or not _same(param.default, _default(field)):
                raise TypeError(f"internal: {fn.__name__}'s option {field.name} must default to "
                                f"{spec_type.__name__}.{field.name}'s default {_default(field)!r}")

        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as err:  # Python's own words for a bad call of fn
                raise TypeError(f"{fn.__name__}() {err}") from None
            spec = bound.arguments.pop("spec", None)
            passed = {name: bound.arguments.pop(name) for name in names if name in bound.arguments}
            if spec is None:
                spec = spec_type(**passed)
            elif not isinstance(spec, spec_type):
                raise UserInputError(f"spec={type(spec).__name__} is not a {spec_type.__name__}")
            elif passed:
                first = next(iter(passed))
                shown = ", ".join(f"{k}={v!r}" for k, v in passed.items())
                raise UserInputError(f"{', '.join(f'{k}=' for k in passed)} given beside spec=: set it in the spec "
                                     f"instead (spec.replace({first}=...)); passed {shown}, the spec has "
                                     f"{first}={getattr(spec, first)!r}")
            bound.arguments.update({name: getattr(spec, name) for name in names}, spec=spec)
            return fn(*bound.args, **bound.kwargs)

        call.__spec_type__ = spec_type
        return call

    return mark


# ------------------------------------------------------------------ the experiments' options, declared once
# Each experiment's options: a frozen dataclass whose fields carry their default, their command-line
# declaration and what they need or replace (`option`); the experiment's spec (`ProfileSpec` ...) adds
# the checks. Here, with the standard library only, so `phaseinterp.cli.args` makes the flags from them
# without loading torch. A field without help is Python-only.
AXES = ("target", "length", "both")
INTERVALS = ("auto", "wilson", "cluster_bootstrap")
CONFORMANCE_MODES = ("decode", "chunked_prefill", "warm", "dtype")
DEFAULT_CONFORMANCE_MODES = ("decode", "chunked_prefill", "dtype")  # warm costs one donor per prompt and L
DTYPES = ("bfloat16", "float16")
CYCLING_MODES = ("roll", "static")
MEASURES = ("logprob", "accuracy")
N_PER_RESIDUE_HELP = ("prompts per residue group (x R = 24 residues for the zoo task); moment matching needs 72, "
                      "77, 80 or any size from 86 for the zoo task; at most 500,000 prompts in all")
_N_HELP = N_PER_RESIDUE_HELP + f" (default: {DEFAULT_N_PER_RESIDUE}, as every experiment)"
_CYCLE_N_HELP = N_PER_RESIDUE_HELP + (f" (default: the --baseline profile's size, else {DEFAULT_N_PER_RESIDUE}, as "
                                      "the library's gate_cycling_profile / gate_cycling_unit)")
_SEED_HELP = "prompt seed, >= 0 (default: 0)"


@typing.no_type_check  # validate() checks each option and names it; a runtime type checker would preempt it
@dataclasses.dataclass(frozen=True)
class ProfileOptions(Spec):
    """`phase_profile`'s options (`ProfileSpec` checks them)."""

    n_per_residue: int = option(DEFAULT_N_PER_RESIDUE, _N_HELP, parse="positive")
    seed: int = option(0, _SEED_HELP, parse="seed")
    batch_size: int = option(64, parse="positive")
    device: Any = None
    stride: int | None = option(None, "fold residues to phases with this stride; must divide R, and for a compressed "
                                "model equal its own stride (another stride hides its phase structure; re-fold "
                                "deliberately with phaseinterp.phase_profile(..., stride=...)) (default: the model's)",
                                parse="positive")
    label: str | None = option(None, "the profile's name (default: the model's label)")
    confidence: float = 0.95
    interval: str = option("auto", choices=INTERVALS)
    n_bootstrap: int = option(2000, needs=("interval", OneOf(("auto", "cluster_bootstrap"))))
    n_permutations: int = 1999
    progress: bool = True
    axis: str = option("target", "target: the target's residue varies at a fixed prompt length; length: the prompt "
                       "length's residue varies with the target's residue held (--hold); both: target phase x length "
                       "phase (default: target)", choices=AXES)
    hold: int | None = option(None, "with --axis length: the target residue mod R held fixed (default: 0)",
                              parse="non_negative", needs=("axis", "length"))
    length_modulus: int | None = option(None, "with --axis length: the length residues' modulus, a multiple of S "
                                        "dividing R (default: R, or the largest the task's layout allows)",
                                        parse="positive", needs=("axis", "length"))


@typing.no_type_check
@dataclasses.dataclass(frozen=True)
class AblationOptions(Spec):
    """`ablate`'s options (`AblationSpec` checks them)."""

    layer: int | Sequence[int] | None = option(None, "distinct layer indices in 0..n_layers-1, e.g. 0 1 or 0,1 "
                                               "(default: every layer)", parse="ints", many=True)
    scope: str = option("kv_head", "one unit per KV head, or one per whole layer (default: kv_head)",
                        choices=("kv_head", "layer"))
    heads: Sequence[Sequence[int]] | None = option(None, excludes=("scope",))  # custom units replace the scope's
    n_per_residue: int = option(DEFAULT_N_PER_RESIDUE, _N_HELP, parse="positive")
    n_calibration: int = option(256, "calibration prompts for the mean; at least R (one per residue) (default: 256)",
                                parse="positive")
    seed: int = 0
    calibration_seed: int = 1
    batch_size: int = 64
    method: str = option("fast", "fast (answer position only, equals naive to 1e-5) or naive (default: fast)",
                         choices=("fast", "naive"))
    device: Any = None
    progress: bool = True


@typing.no_type_check
@dataclasses.dataclass(frozen=True)
class GateCyclingOptions(Spec):
    """The options both gate-cycling scores share (`CyclingOptions`, `UnitCyclingOptions`)."""

    shifts: Sequence[int] | None = option(None, "shifts in slots, each non-zero mod S, e.g. -1 1 2 or -1,1,2 (default: "
                                          "every distinct shift mod S, e.g. -1 1 2 for S = 4)", parse="ints", many=True)
    layers: int | Sequence[int] | None = option(None, "distinct layer indices to shift, e.g. 0 1 or 0,1 (default: "
                                                "every layer)", parse="ints", many=True, flag="--layer")
    kv_heads: int | Sequence[int] | None = option(None, "KV heads whose gates move, e.g. 0 or 0,1 (default: every KV "
                                                  "head of --layer)", parse="ints", many=True)
    mode: str = option("roll", "roll the gate parameters, or shift only the prompt-independent part of each slot's "
                       "gate logit (default: roll)", choices=CYCLING_MODES)
    n_per_residue: int | None = DEFAULT_N_PER_RESIDUE
    seed: int = option(0, parse="seed")
    n_calibration: int = option(256, parse="positive")
    calibration_seed: int = option(1, parse="seed")
    batch_size: int = option(64, parse="positive")
    n_boot: int = option(1000, parse="positive")
    progress: bool = True


@typing.no_type_check
@dataclasses.dataclass(frozen=True)
class CyclingOptions(GateCyclingOptions):
    """`gate_cycling_profile`'s options (`CyclingSpec` checks them); ``n_per_residue=None``: the baseline
    profile's size, else the default."""

    branch: str = option("both", "shift the key gates, the value gates or both (default: both)",
                         choices=("both", "k", "v"))
    n_per_residue: int | None = option(None, _CYCLE_N_HELP, parse="positive")


@typing.no_type_check
@dataclasses.dataclass(frozen=True)
class UnitCyclingOptions(GateCyclingOptions):
    """`gate_cycling_unit`'s options (`UnitCyclingSpec` checks them)."""

    measure: str = option("logprob", "the unit score's measure (default: logprob, the mean answer log-prob)",
                          choices=MEASURES)
    n_per_residue: int = option(DEFAULT_N_PER_RESIDUE, _CYCLE_N_HELP, parse="positive")


@typing.no_type_check
@dataclasses.dataclass(frozen=True)
class GateProfileOptions(Spec):
    """`gate_profile`'s options (`GateProfileSpec` checks them)."""

    n_per_residue: int = option(8, "prompts per residue; any size works here (no moment matching) (default: 8)",
                                parse="positive")
    seed: int = option(0, parse="seed")
    batch_size: int = option(64, parse="positive")


@typing.no_type_check
@dataclasses.dataclass(frozen=True)
class ConformanceOptions(Spec):
    """`conformance`'s options (`ConformanceSpec` checks them)."""

    modes: Sequence[str] = option(DEFAULT_CONFORMANCE_MODES, "what to compare with the reference (default: decode "
                                  "chunked_prefill dtype; warm: each prompt answered from the cache of a donor sharing "
                                  "its prefix, one length per cut phase)", choices=CONFORMANCE_MODES, many=True)
    n_per_residue: int = option(8, "prompts per residue (x R = 24), each shown at every answer phase; target moments "
                                "are matched best-effort (default: 8)", parse="positive")
    seed: int = option(0, _SEED_HELP, parse="seed")
    answer_phases: Sequence[int] | None = None
    cut_phases: Sequence[int] | None = None
    chunk: int | None = option(None, "tokens per prefill piece after the first; a multiple of the cut period (the "
                               "stride; for DeepSeek-V4 the lcm of its compress rates) (default: the smallest multiple "
                               ">= 2 local windows)", parse="positive")
    dtypes: Sequence[str] = option(DTYPES, "low precisions of the dtype mode; one the device cannot run is skipped and "
                                   "named (default: bfloat16 float16)", choices=DTYPES, many=True,
                                   needs=("modes", Contains("dtype")))
    tolerance: Mapping[str, Any] | None = None
    prefix_lengths: Sequence[int] | None = None
    batch_size: int = option(256, parse="positive")
    confidence: float = 0.95
    n_bootstrap: int = 2000
    label: str | None = None
    progress: bool = True
