"""An experiment's options, checked once: the spec.

Every experiment is three steps, each its own function:

1. **spec**: a frozen dataclass of the experiment's options (`ProfileSpec`, `AblationSpec`, ...).
   Making one checks every option against its valid range and against the others, before a model
   or a task is touched; ``spec.check_model(model)`` adds the checks that need the model's config
   (layer indices, strides, KV heads: it reads only ``cfg``, so the command line runs it on a
   checkpoint's config.json before the weights load) and ``spec.check_task(task)`` those that need
   the task (prompt counts the task can lay out, calibration sizes).
2. **records**: the model run on the spec's prompts, one row (or column) per prompt.
3. **result**: the statistics of the records (a `phaseinterp.results.Result`).

The experiment functions keep their keyword options (``phase_profile(model, seed=1)``); they build
the spec from them, or take a ready one (``phase_profile(model, spec=spec)``), never both. The
command line fills a spec from its arguments (`Spec.from_args`), so a bad option reads the same
from Python and from the shell, and is checked in one place.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, ClassVar, TypeVar

from phaseinterp.errors import UserInputError

S = TypeVar("S", bound="Spec")


@dataclasses.dataclass(frozen=True)
class Spec:
    """Base of the experiment specs: validation on construction, `check_model`, `check_task`,
    `from_args`, `replace`, `options`."""

    # option name -> the command-line argument (argparse dest) that fills it, where they differ
    ARGS: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every option on its own and against the others (no model, no task); a
        `UserInputError` naming the value and its valid range."""

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
        """The spec of a parsed command line: each option from the argument of its name (or the one
        `ARGS` maps it to); an argument left unset (None) keeps the option's default."""
        values = {}
        for field in dataclasses.fields(cls):
            value = getattr(args, cls.ARGS.get(field.name, field.name), None)
            if value is not None:
                values[field.name] = value
        values.update(overrides)
        return cls(**values)

    def replace(self: S, **changes: Any) -> S:
        """A copy with ``changes`` applied (and checked again)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise UserInputError(f"{type(self).__name__} has no option {', '.join(unknown)} "
                                 f"(options: {', '.join(f.name for f in dataclasses.fields(self))})")
        return dataclasses.replace(self, **changes)

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
    """Make ``fn`` an experiment of ``spec_type``: its keyword options are the spec's fields (each with
    the field's default, checked here when the module loads, so the signature and the spec cannot
    drift apart), and it also takes ``spec=``. A call builds the spec from the options it passes (or
    takes ``spec=`` as given, refusing options beside it) and runs ``fn`` with ``spec=`` the checked
    spec; ``fn`` reads its options from the spec only."""

    def wrap(fn: Callable) -> Callable:
        signature = inspect.signature(fn)
        fields = {f.name: f for f in dataclasses.fields(spec_type)}
        if "spec" not in signature.parameters:
            raise TypeError(f"internal: {fn.__name__} must take spec=")
        for name, field in fields.items():
            param = signature.parameters.get(name)
            if param is None or not _same(param.default, _default(field)):
                raise TypeError(f"internal: {fn.__name__}'s option {name} must default to "
                                f"{spec_type.__name__}.{name}'s default {_default(field)!r}")

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind_partial(*args, **kwargs)
            except TypeError as err:
                raise UserInputError(f"{fn.__name__}: {err}") from None
            given = {name: bound.arguments.pop(name) for name in list(bound.arguments) if name in fields}
            spec = bound.arguments.pop("spec", None)
            if spec is None:
                spec = spec_type(**given)
            elif not isinstance(spec, spec_type):
                raise UserInputError(f"spec={type(spec).__name__} is not a {spec_type.__name__} "
                                     f"({fn.__name__}'s options)")
            elif given:
                raise UserInputError(f"{fn.__name__}: {', '.join(f'{k}=' for k in given)} given beside spec=: set it in "
                                     f"the spec instead (spec.replace({next(iter(given))}=...))")
            return fn(*bound.args, **bound.kwargs, spec=spec)

        call.__spec_type__ = spec_type
        return call

    return wrap


__all__ = ["Spec", "experiment"]
