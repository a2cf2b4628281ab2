"""A fuzzer over the public surface (issue 37): every public function of ``phaseinterp.__all__`` and
every CLI subcommand, called with drawn argument values of the wrong type, out of range, empty,
None, NaN, negative, huge, and paths that are missing, relative, a file, a folder, unwritable or
another kind of saved object. Each call either succeeds or raises `UserInputError` naming the
argument (CLI: exit code 2 and one line); no other exception escapes phaseinterp's own checks,
and a refused call writes nothing.

The draws reach our own checks: a typed parameter gets values of its annotated type that are still bad
(`typed_values`: out of range, negative, huge, empty, NaN) and, one draw in `WRONG_TYPE_SHARE`, a value of
any type; each call runs without the suite's runtime type hook (`_as_user`), as a user's does.
``COUNTS["reached the function body"]`` counts the draws that entered the called function's own code.

Bounded: the smallest model (2 layers, d_model 32, R = 8), 23 prompts per residue, and a fixed
seed (``derandomize=True``) with ``max_examples`` per function from ``PHASEINTERP_FUZZ_EXAMPLES``
(default 12). A larger run: ``PHASEINTERP_FUZZ_EXAMPLES=500 python -m pytest tests/test_fuzz_inputs.py -n 0``.
The CLI tier stops each command where its checks end (the model load, the experiment, the
training loop are replaced by a sentinel), so it tests the checks, not the experiments.
"""

from __future__ import annotations

import collections.abc
import inspect
import math
import os
import shutil
import stat
import sys
import typing
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jaxtyping import AbstractArray

import phaseinterp as pi
from phaseinterp import CompressedConfig, CompressedTransformer
from phaseinterp._checks import experiment
from phaseinterp.errors import UserInputError
from phaseinterp.tasks import KeyValueRetrieval
from typecheck import as_user

EXAMPLES = int(os.environ.get("PHASEINTERP_FUZZ_EXAMPLES", "12"))
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
TASK = KeyValueRetrieval(seq_len=64, n_records=8, n_demos=2, min_distance=20, residue_modulus=8)
CFG = CompressedConfig(d_vocab=TASK.vocab.size, n_ctx=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1,
                       d_head=16, d_mlp=64, window=4, stride=4, local_window=8)
COUNTS: dict[str, int] = {}
HOOK_ERRORS: tuple[type, ...] = ()  # the test suite's runtime type checker (conftest), which users do not have
try:
    from beartype.roar import BeartypeCallHintViolation
    from jaxtyping import TypeCheckError

    HOOK_ERRORS = (TypeCheckError, BeartypeCallHintViolation)
except ImportError:  # pragma: no cover
    pass


def U(fn):
    """``fn`` without the test suite's type-checking wrapper: a user calls the function itself, whose
    own checks are what the fuzzer tests (as ``_unchecked`` in test_bad_inputs). Only jaxtyping's
    wrapper is removed: ``@torch.inference_mode()`` and other decorators of our own stay."""
    code = getattr(fn, "__code__", None)
    if code is None or "jaxtyping" not in code.co_filename or not hasattr(fn, "__wrapped__"):
        return fn
    inner, spec_type = fn.__wrapped__, getattr(fn, "__spec_type__", None)
    if spec_type is not None and not hasattr(inner, "__spec_type__"):  # fn made the experiment's spec: keep that
        return experiment(spec_type)(inner)
    return inner

# ----------------------------------------------------------------- values
HUGE = 10**12
values = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 12), st.sampled_from([-1, 0, HUGE, -HUGE, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True, width=32), st.sampled_from([math.nan, math.inf, -0.0, 1.5]),
    st.text(max_size=6), st.sampled_from(["", "1", "nan", "-1", "bfloat16", "cpu:1", "cuda:7", "mps", "x" * 300]),
    st.lists(st.integers(-3, 9), max_size=4), st.just([]), st.just(()), st.just({}),
    st.dictionaries(st.text(max_size=3), st.integers(0, 3), max_size=2), st.just(object()),
    st.just(torch.tensor([1.0, math.nan])),
)
# Values of the annotated type that are still bad (out of range, negative, huge, empty, NaN): for a typed
# parameter most draws come from these, so they test the function's range checks; one draw in
# WRONG_TYPE_SHARE comes from `values` (any type), which tests its type checks.
WRONG_TYPE_SHARE = 4
TYPED = {
    int: st.one_of(st.integers(-3, 12), st.sampled_from([-1, 0, HUGE, -HUGE, 2**63])),
    float: st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32),
                     st.sampled_from([math.nan, math.inf, -math.inf, -0.0, -1.0, 0.0, 1e30])),
    str: st.one_of(st.text(max_size=6),
                   st.sampled_from(["", " ", "nan", "-1", "BOTH", "cpu:1", "cuda:7", "mps", "x" * 300])),
    bool: st.booleans(),
    torch.Tensor: st.one_of(
        st.sampled_from([torch.zeros(0, dtype=torch.long), torch.zeros(2, 0, dtype=torch.long),
                         torch.zeros(3, dtype=torch.long), torch.full((2, 40), -1), torch.full((2, 40), 10**6),
                         torch.tensor([[1.0, math.nan]]), torch.zeros(1, 2, 3, dtype=torch.long)])),
}
# Sizes (prompts, batches, resamples, seeds): every small positive value is valid and runs the whole
# experiment, so their integers are the ones at the edges (a huge size must be refused before any work,
# or run as one batch), which keeps the run bounded.
SIZE_ARGS = {"batch_size", "n_boot", "n_permutations", "n_calibration", "n_per_residue", "seed", "max_phases"}
SIZE_INTS = st.sampled_from([-3, -1, 0, HUGE, -HUGE, 2**63])


def typed_values(annotation, size: bool = False) -> st.SearchStrategy:
    """Bad values of ``annotation``'s own type; `values` (any type) where the annotation says nothing.
    ``size``: an integer is drawn from `SIZE_INTS`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is int and size:
        return SIZE_INTS
    if origin is typing.Union:
        return st.one_of(*[typed_values(a, size) for a in args])
    if annotation is type(None):
        return st.none()
    if origin in (list, tuple, collections.abc.Sequence) and args:
        item = typed_values(args[0], size)
        return st.one_of(st.just([]), st.lists(item, min_size=1, max_size=2), st.lists(item, max_size=2).map(tuple))
    if isinstance(annotation, type) and issubclass(annotation, (torch.Tensor, AbstractArray)):  # Float[Tensor, ...]
        return TYPED[torch.Tensor]
    for kind, strategy in TYPED.items():
        if annotation is kind:
            return strategy
    return values


def drawn_values(target, arg: str) -> st.SearchStrategy:
    """For ``target``'s parameter ``arg``: mostly `typed_values` of its annotation, a share of `values`."""
    function = inspect.unwrap(target)
    annotation = inspect.signature(function).parameters[arg].annotation
    if isinstance(annotation, str):  # `from __future__ import annotations`: evaluate this one alone
        try:
            annotation = eval(annotation, function.__globals__)  # noqa: S307 - our own source's annotation
        except (NameError, TypeError, SyntaxError):  # a name imported only for type checkers
            annotation = inspect.Parameter.empty
    if annotation in (inspect.Parameter.empty, typing.Any):
        return values
    typed = typed_values(annotation, arg in SIZE_ARGS)
    return st.integers(0, WRONG_TYPE_SHARE - 1).flatmap(lambda i: values if i == 0 else typed)




PATH_KINDS = ["missing", "relative-missing", "file", "empty-folder", "user-folder", "unwritable", "result", "checkpoint",
              "hf-checkpoint", "", "nul"]


def _classify(value) -> str:
    """The class of a drawn value, for the counts in RESULTS."""
    if value is None:
        return "None"
    if isinstance(value, bool) or not isinstance(value, (int, float, str, list, tuple, dict)):
        return "wrong type"
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN/inf"
    if isinstance(value, (int, float)):
        return "negative" if value < 0 else "huge" if abs(value) >= 10**9 else "out of range"
    if len(value) == 0:
        return "empty"
    return "wrong type" if isinstance(value, (str, dict)) else "out of range"


def _count(kind: str) -> None:
    COUNTS[kind] = COUNTS.get(kind, 0) + 1


@contextmanager
def _reach_counter(target):
    """Count the draw as reaching ``target``'s body (``COUNTS["reached the function body"]``) when the
    code object of the function itself (under any wrappers: the type hook's, ``@contextmanager``'s) is
    entered; a draw the type hook stops never enters it. ``sys.setprofile`` sees every Python call;
    it is removed at the first entry, so the experiment itself runs unwatched."""
    code = inspect.unwrap(target).__code__
    previous = sys.getprofile()
    seen = []

    def watch(frame, event, arg):
        if event == "call" and frame.f_code is code:
            seen.append(True)
            sys.setprofile(previous)

    sys.setprofile(watch)
    try:
        yield
    finally:
        sys.setprofile(previous)
        _count("reached the function body" if seen else "did not reach the function body")


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """A checkpoint, a saved result, an HF checkpoint, a file, an unwritable folder (each kept unchanged)."""
    root = tmp_path_factory.mktemp("fuzz")
    model = CompressedTransformer(CFG)
    model.metadata.update(task=TASK.to_dict(), task_type="KeyValueRetrieval")
    model.save_pretrained(root / "checkpoint")
    U(pi.phase_profile)(model, TASK.generate(23, seed=0), progress=False, n_permutations=19).save(root / "result")
    (root / "hf-checkpoint").mkdir()
    (root / "hf-checkpoint" / "config.json").write_text('{"model_type": "deepseek_v4"}')
    (root / "file").write_text("a user's file")
    (root / "user-folder").mkdir()
    (root / "user-folder" / "notes.txt").write_text("the user's notes")
    (root / "empty-folder").mkdir()
    (root / "unwritable").mkdir()
    os.chmod(root / "unwritable", stat.S_IRUSR | stat.S_IXUSR)
    return root


@pytest.fixture(scope="module")
def model(places):
    return CompressedTransformer.from_pretrained(places / "checkpoint").eval()


def _path(kind: str, root: Path):
    if kind == "":
        return ""
    if kind == "nul":
        return str(root / "a\x00b")
    if kind == "relative-missing":
        return "no/such/relative/path"
    if kind == "unwritable":
        return root / "unwritable" / "new"
    return root / kind


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _names_it(err: BaseException, names: tuple[str, ...], value) -> bool:
    text = str(err)
    return any(n in text for n in names) or (isinstance(value, (str, int)) and not isinstance(value, bool)
                                               and repr(value) in text)


def _call(fn, names: tuple[str, ...], value, kind: str, target=None):
    """Run ``fn()``; success or a UserInputError naming the argument; anything else fails the test."""
    _count(kind)
    try:
        with as_user():
            if target is None:
                result = fn()
            else:
                with _reach_counter(target):
                    result = fn()
    except HOOK_ERRORS:  # a class constructor, which the hook wraps where U() cannot reach: not ours to judge
        _count("stopped by the test's type hook")
        return None
    except UserInputError as err:
        assert _names_it(err, names, value), f"{names[0]}={value!r}: the message does not name it: {err}"
        assert "\n" not in str(err).strip() or len(str(err)) < 2000, err
        return None
    return result


# ------------------------------------------------------- API: the experiments
def _batch():
    return TASK.generate(23, seed=0)


API = {  # function -> {argument: (names the message may use, call(model, value))}
    "phase_profile": {
        "task": (("task",), lambda m, v: U(pi.phase_profile)(m, v, progress=False, n_permutations=9)),
        "n_per_residue": (("n_per_residue",), lambda m, v: U(pi.phase_profile)(m, TASK, n_per_residue=v, progress=False,
                                                                              n_permutations=9)),
        "stride": (("stride",), lambda m, v: U(pi.phase_profile)(m, _batch(), stride=v, progress=False, n_permutations=9)),
        "batch_size": (("batch_size",), lambda m, v: U(pi.phase_profile)(m, _batch(), batch_size=v, progress=False,
                                                                        n_permutations=9)),
        "seed": (("seed",), lambda m, v: U(pi.phase_profile)(m, TASK, n_per_residue=23, seed=v, progress=False, n_permutations=9)),
        "device": (("device",), lambda m, v: U(pi.phase_profile)(m, _batch(), device=v, progress=False, n_permutations=9)),
        "confidence": (("confidence",), lambda m, v: U(pi.phase_profile)(m, _batch(), confidence=v, progress=False,
                                                                        n_permutations=9)),
        "n_permutations": (("n_permutations",), lambda m, v: U(pi.phase_profile)(m, _batch(), n_permutations=v,
                                                                                progress=False)),
    },
    "ablate": {
        "layer": (("layer",), lambda m, v: U(pi.ablate)(m, layer=v, prompts=_batch(), n_calibration=8, progress=False)),
        "scope": (("scope",), lambda m, v: U(pi.ablate)(m, scope=v, prompts=_batch(), n_calibration=8, progress=False)),
        "n_calibration": (("n_calibration",), lambda m, v: U(pi.ablate)(m, n_calibration=v, prompts=_batch(),
                                                                       progress=False)),
        "method": (("method",), lambda m, v: U(pi.ablate)(m, method=v, prompts=_batch(), n_calibration=8, progress=False)),
        "batch_size": (("batch_size",), lambda m, v: U(pi.ablate)(m, batch_size=v, prompts=_batch(), n_calibration=8,
                                                                 progress=False)),
        "heads": (("heads",), lambda m, v: U(pi.ablate)(m, heads=v, prompts=_batch(), n_calibration=8, progress=False)),
        "prompts": (("prompts",), lambda m, v: U(pi.ablate)(m, prompts=v, n_calibration=8, progress=False)),
    },
    "gate_cycling_profile": {
        "shifts": (("shifts", "shift"), lambda m, v: U(pi.gate_cycling_profile)(m, shifts=v, prompts=_batch(), progress=False,
                                                                      n_boot=9)),
        "layers": (("layers", "layer"), lambda m, v: U(pi.gate_cycling_profile)(m, shifts=[1], layers=v, prompts=_batch(),
                                                                      progress=False, n_boot=9)),
        "kv_heads": (("kv_heads", "kv_head"), lambda m, v: U(pi.gate_cycling_profile)(m, shifts=[1], kv_heads=v, prompts=_batch(),
                                                                            progress=False, n_boot=9)),
        "branch": (("branch",), lambda m, v: U(pi.gate_cycling_profile)(m, shifts=[1], branch=v, prompts=_batch(), progress=False,
                                                              n_boot=9)),
        "mode": (("mode",), lambda m, v: U(pi.gate_cycling_profile)(m, shifts=[1], mode=v, prompts=_batch(), progress=False,
                                                          n_boot=9)),
        "n_boot": (("n_boot",), lambda m, v: U(pi.gate_cycling_profile)(m, shifts=[1], n_boot=v, prompts=_batch(),
                                                              progress=False)),
    },
    "gate_cycling_unit": {
        "layers": (("layers", "layer"), lambda m, v: U(pi.gate_cycling_unit)(m, shifts=[1], layers=v, prompts=_batch(),
                                                                           n_calibration=8, progress=False, n_boot=9)),
        "kv_heads": (("kv_heads", "kv_head"), lambda m, v: U(pi.gate_cycling_unit)(
            m, shifts=[1], layers=[0], kv_heads=v, prompts=_batch(), n_calibration=8, progress=False, n_boot=9)),
        "measure": (("measure",), lambda m, v: U(pi.gate_cycling_unit)(m, shifts=[1], layers=[0], measure=v,
                                                                       prompts=_batch(), n_calibration=8,
                                                                       progress=False, n_boot=9)),
        "n_calibration": (("n_calibration",), lambda m, v: U(pi.gate_cycling_unit)(
            m, shifts=[1], layers=[0], n_calibration=v, prompts=_batch(), progress=False, n_boot=9)),
    },
    "gate_profile": {
        "n_per_residue": (("n_per_residue",), lambda m, v: U(pi.gate_profile)(m, TASK, n_per_residue=v)),
        "batch_size": (("batch_size",), lambda m, v: U(pi.gate_profile)(m, TASK, n_per_residue=2, batch_size=v)),
    },
    "shift_gates": {
        "shift": (("shift",), lambda m, v: _enter(pi.shift_gates(m, v))),
        "layers": (("layers", "layer"), lambda m, v: _enter(pi.shift_gates(m, 1, layers=v))),
        "branch": (("branch",), lambda m, v: _enter(pi.shift_gates(m, 1, branch=v))),
        "kv_heads": (("kv_heads", "kv_head"), lambda m, v: _enter(pi.shift_gates(m, 1, kv_heads=v))),
    },
    "shifted_copy": {
        "shift": (("shift",), lambda m, v: U(pi.shifted_copy)(m, v)),
        "layers": (("layers", "layer"), lambda m, v: U(pi.shifted_copy)(m, 1, layers=v)),
        "branch": (("branch",), lambda m, v: U(pi.shifted_copy)(m, 1, branch=v)),
    },
    "mean_gate_logits": {
        "tokens": (("tokens",), lambda m, v: U(pi.mean_gate_logits)(m, v)),
        "layers": (("layers", "layer"), lambda m, v: U(pi.mean_gate_logits)(m, _batch().tokens[:4, :40], layers=v)),
        "batch_size": (("batch_size",), lambda m, v: U(pi.mean_gate_logits)(m, _batch().tokens[:4, :40], batch_size=v)),
    },
    "specialized_units": {
        "max_phases": (("max_phases",), lambda m, v: U(pi.specialized_units)(m, TASK, max_phases=v, n_per_residue=23,
                                                                          n_calibration=8, progress=False)),
        "layers": (("layers", "layer"), lambda m, v: U(pi.specialized_units)(m, TASK, layers=v, n_per_residue=23,
                                                                           n_calibration=8, progress=False)),
    },
    "CompressedTransformer": {
        "cfg": (("cfg",), lambda m, v: CompressedTransformer(v)),
        "device": (("device",), lambda m, v: CompressedTransformer(CFG, device=v)),
    },
    "CompressedConfig": {
        field: ((field,), (lambda f: lambda m, v: CompressedConfig(**{f: v}))(field))
        for field in ("d_model", "n_layers", "n_heads", "n_kv_heads", "window", "stride", "local_window", "gate")
    },
    "zoo.load": {
        "name": (("name",), lambda m, v: U(pi.zoo.load)(v)),
        "device": (("device",), lambda m, v: U(pi.zoo.load)("w4s4", device=v)),
    },
    "load_hf": {
        "device_map": (("device_map",), lambda m, v: U(pi.load_hf)(pi.zoo.CHECKPOINT_DIR / "dsv4-tiny", device_map=v)),
        "dtype": (("dtype",), lambda m, v: U(pi.load_hf)(pi.zoo.CHECKPOINT_DIR / "dsv4-tiny", dtype=v)),
    },
    "from_hf": {"hf_model": (("from_hf", "hf_model"), lambda m, v: U(pi.from_hf)(v))},
    "OpenAIEngine": {
        "base_url": (("base_url",), lambda m, v: pi.OpenAIEngine(v, "m", 32)),
        "d_vocab": (("d_vocab",), lambda m, v: pi.OpenAIEngine("http://127.0.0.1:9/v1", "m", v)),
        "top_logprobs": (("top_logprobs",), lambda m, v: pi.OpenAIEngine("http://127.0.0.1:9/v1", "m", 32,
                                                                           top_logprobs=v)),
        "timeout": (("timeout",), lambda m, v: pi.OpenAIEngine("http://127.0.0.1:9/v1", "m", 32, timeout=v)),
    },
    # DeepSeek-V4 only: the small random V4 of test_deepseek_v4 (3 layers, CSA at 0 and 2), 3 prompts per residue
    "indexer_phase": {
        arg: (names, (lambda a: lambda m, v: U(pi.indexer_phase)(_dsv4(), DSV4_TASK, **_dsv4_args(a, v)))(arg))
        for arg, names in (("layers", ("layers", "layer")), ("n_per_residue", ("n_per_residue",)),
                           ("batch_size", ("batch_size",)), ("prompts", ("prompts",)),
                           ("confidence", ("confidence",)), ("seed", ("seed",)))
    },
    "force_target_selection": {
        arg: (names, (lambda a: lambda m, v: U(pi.force_target_selection)(_dsv4(), DSV4_TASK, **_dsv4_args(a, v)))(arg))
        for arg, names in (("layers", ("layers", "layer")), ("batch_size", ("batch_size",)),
                           ("prompts", ("prompts",)), ("confidence", ("confidence",)))
    },
    "conformance": {  # the small compressed model, decode only, 2 prompts per residue
        arg: (names, (lambda a: lambda m, v: U(pi.conformance)(m, TASK, **{**CONFORMANCE, a: v}))(arg))
        for arg, names in (("modes", ("modes", "mode")), ("n_per_residue", ("n_per_residue",)),
                           ("answer_phases", ("answer_phases", "answer phase")),
                           ("cut_phases", ("cut_phases", "cut phase")), ("chunk", ("chunk",)),
                           ("dtypes", ("dtypes", "dtype")), ("tolerance", ("tolerance",)),
                           ("batch_size", ("batch_size",)), ("confidence", ("confidence",)),
                           ("n_bootstrap", ("n_bootstrap",)))
    },
}
CONFORMANCE = dict(modes=("decode",), n_per_residue=2, answer_phases=[0, 3], n_bootstrap=9, progress=False)
_DSV4 = []


def _dsv4():
    """The small random DeepSeek-V4 (tests/test_deepseek_v4.py's), wrapped once per run."""
    if not _DSV4:
        from test_deepseek_v4 import make_hf

        _DSV4.append(pi.from_hf(make_hf()))
    return _DSV4[0]


def _dsv4_args(arg: str, value) -> dict:
    """Small settings for the V4 experiments, with ``arg`` set to the drawn ``value``."""
    settings = {"prompts": DSV4_TASK.generate(3, seed=0, strict=False)} if arg not in ("n_per_residue", "seed") \
        else {"n_per_residue": 16}
    return {**settings, arg: value}


DSV4_TASK = TASK  # the V4 of test_deepseek_v4 reads the same task
# Public names of phaseinterp.__all__ the table above does not call, with the reason.
NOT_CALLED = {
    "DEFAULT_N_PER_RESIDUE": "a constant (an int), not a function",
    "AblationResult": "a result class: its load is fuzzed in test_fuzz_paths",
    "CyclingResult": "a result class: its load is fuzzed in test_fuzz_paths",
    "GateProfile": "a result class: its load is fuzzed in test_fuzz_paths",
    "PhaseProfile": "a result class: load and save are fuzzed in test_fuzz_paths",
    "IndexerPhaseResult": "a result class", "ForcedSelectionResult": "a result class",
    "ConformanceResult": "a result class", "UnitCyclingResult": "a result class", "UnitSelection": "a result class",
    "TwoAxisProfile": "a result class (two PhaseProfiles): save and load round trip in test_length_axis",
    "CheckpointError": "an error class", "KVCache": "the model's cache object, built by the model",
    "load": "every kind of source and its refusals: tests/test_load.py; its device in test_bad_inputs' device walk",
    "shift_static_gates": "shares check_shift/check_layers/check_kv_heads with shift_gates (fuzzed)",
    "ProfileSpec": "an experiment's options: fuzzed through phase_profile, which builds it from the drawn option",
    "AblationSpec": "an experiment's options: fuzzed through ablate, which builds it from the drawn option",
    "CyclingSpec": "an experiment's options: fuzzed through gate_cycling_profile, which builds it",
    "UnitCyclingSpec": "an experiment's options: fuzzed through gate_cycling_unit, which builds it",
    "ConformanceSpec": "an experiment's options: fuzzed through conformance, which builds it",
    "GateProfileSpec": "an experiment's options: fuzzed through gate_profile, which builds it",
    "SelectionSpec": "an experiment's options: fuzzed through specialized_units, which builds it",
    "IndexerSpec": "an experiment's options: fuzzed through indexer_phase and force_target_selection, which build it",
    "engine_profile": "phase_profile's ProfileSpec (fuzzed through phase_profile) plus an engine's answers, fuzzed in "
                      "test_fuzz_answers; its own options: tests/test_engine_profile.py",
    "phase": "a module", "stats": "a module", "tasks": "a module", "theory": "a module", "zoo": "a module (zoo.load is fuzzed)",
    "paper": "a module (the paper's published numbers: its lookups are tested in tests/test_paper.py, its writer "
             "`phaseinterp paper --out` is fuzzed in test_fuzz_cli and walked in tests/test_bad_inputs.py)",
}
COVERED = set(API) | {"zoo"}
# The function whose own body each API row calls (for the reach counter: `_reach_counter`).
TARGETS = {"phase_profile": pi.phase_profile, "ablate": pi.ablate, "gate_cycling_profile": pi.gate_cycling_profile,
           "gate_cycling_unit": pi.gate_cycling_unit,
           "gate_profile": pi.gate_profile, "shift_gates": pi.shift_gates, "shifted_copy": pi.shifted_copy,
           "mean_gate_logits": pi.mean_gate_logits, "specialized_units": pi.specialized_units,
           "CompressedTransformer": CompressedTransformer.__init__, "CompressedConfig": CompressedConfig.__init__,
           "zoo.load": pi.zoo.load, "load_hf": pi.load_hf, "from_hf": pi.from_hf,
           "OpenAIEngine": pi.OpenAIEngine.__init__, "indexer_phase": pi.indexer_phase,
           "force_target_selection": pi.force_target_selection, "conformance": pi.conformance}


def _enter(manager):
    with manager:
        return None


def test_every_public_function_is_fuzzed_or_says_why_not():
    public = set(pi.__all__)
    assert public - COVERED - set(NOT_CALLED) == set(), "a public name neither fuzzed nor listed in NOT_CALLED"
    assert set(NOT_CALLED) - public == set()


CASES = [(fn, arg) for fn, args in API.items() for arg in args]


@pytest.mark.parametrize("fn, arg", CASES, ids=[f"{f}-{a}" for f, a in CASES])
def test_fuzz_api(fn, arg, model, places):
    names, call = API[fn][arg]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    before = _snapshot(places)

    @FUZZ
    @given(value=drawn_values(TARGETS[fn], arg))
    def run(value):
        _call(lambda: call(model, value), names, value, _classify(value), TARGETS[fn])

    run()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items()), "the model was changed"
    assert _snapshot(places) == before


# ------------------------------------------------------------------ paths
PATH_CALLS = {
    "PhaseProfile.load": (("directory",), lambda m, p, places: pi.PhaseProfile.load(p)),
    "AblationResult.load": (("directory",), lambda m, p, places: pi.AblationResult.load(p)),
    "PhaseProfile.save": (("directory",), lambda m, p, places: pi.PhaseProfile.load(places / "result").save(p)),
    "CompressedTransformer.save_pretrained": (("directory",), lambda m, p, places: m.save_pretrained(p)),
    "CompressedTransformer.from_pretrained": (("directory",), lambda m, p, places: CompressedTransformer.from_pretrained(p)),
    "load_hf": (("path",), lambda m, p, places: U(pi.load_hf)(p)),
    "report.check_report_dir": (("out_dir",), lambda m, p, places: U(pi.report.check_report_dir)(p)),
    "report.check.report_page": (("page",), lambda m, p, places: __import__(
        "phaseinterp.report.check", fromlist=["x"]).report_page(p)),
    "train(out_dir)": (("out_dir",), lambda m, p, places: _train_checks_only(p)),
}


def _train_checks_only(out_dir):
    """train's own checks on ``out_dir``, stopping before the first step (the sentinel)."""
    from phaseinterp.train import compressed

    original = compressed._make_optimizer

    def stop(*args, **kwargs):
        raise _Reached

    compressed._make_optimizer = stop
    try:
        pi.train.train(CFG.replace(n_layers=1), TASK, steps=1, out_dir=out_dir, progress=False)
    except _Reached:
        return None
    finally:
        compressed._make_optimizer = original


class _Reached(Exception):
    """Raised where a command's checks end and its work would begin."""


@pytest.mark.parametrize("name", sorted(PATH_CALLS))
def test_fuzz_paths(name, model, places, tmp_path, monkeypatch):
    names, call = PATH_CALLS[name]
    monkeypatch.chdir(tmp_path)
    before = _snapshot(places)

    @FUZZ
    @given(kind=st.sampled_from(PATH_KINDS), as_str=st.booleans())
    def run(kind, as_str):
        path = _path(kind, places)
        path = str(path) if as_str else path
        _count(f"path: {kind}")
        existed = kind not in ("", "nul") and Path(path).exists()
        try:
            call(model, path, places)
        except UserInputError as err:
            assert _names_it(err, names + (str(path),), None) or str(path) in str(err), (name, kind, str(err))
            assert existed or kind in ("", "nul") or not Path(path).exists(), f"{name} refused {kind} but wrote it"
        else:  # a successful write to a new path (as root, "unwritable" is writable): start the next one clean
            if not existed and kind not in ("", "nul") and Path(path).exists():
                shutil.rmtree(path) if Path(path).is_dir() else Path(path).unlink()
            if kind == "empty-folder":  # an empty folder is a valid target: empty it again
                shutil.rmtree(path)
                Path(path).mkdir()
        after = _snapshot(places)
        assert after == before, (f"{name} changed {kind}", sorted(set(after) ^ set(before)))
        assert not list(Path(tmp_path).iterdir()) or name.endswith(("save", "save_pretrained", "train(out_dir)")), \
            f"{name} wrote into the working directory"
        for child in list(Path(tmp_path).iterdir()):  # a successful save of a relative path: start the next clean
            shutil.rmtree(child) if child.is_dir() else child.unlink()

    run()


# ------------------------------------------------------------------- the CLI
def _cli_verbs():
    from phaseinterp.cli.args import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices
    verbs = {}
    for verb, parser in sub.items():
        if verb in ("zoo", "experiments"):
            for z, zp in parser._subparsers._group_actions[0].choices.items():
                verbs[f"{verb} {z}"] = zp
        else:
            verbs[verb] = parser
    return verbs


CLI_VALUES = ["", "0", "-1", "nan", "inf", "1e9", "999999999999", "x", "1,x", "bfloat16", "cpu:1", "cuda:7", "mps",
              "no/such/relative", "{file}", "{user-folder}", "{result}", "{checkpoint}", "{unwritable}/new",
              "{empty-folder}", "w4s4", "dsv4-tiny", "none"]


def _stop_work(monkeypatch):
    """Replace each command's work (model loads, experiments, training, building) by the sentinel."""
    import phaseinterp.report as report
    import phaseinterp.train as train
    from phaseinterp import zoo
    from phaseinterp.models import loading
    from phaseinterp.experiments import remedy
    from phaseinterp.models.hf import export, memory
    from phaseinterp.report import paper as report_paper
    from phaseinterp.zoo import deepseek_v4 as hf_zoo

    def stop(*args, **kwargs):
        raise _Reached

    for owner, name in ((loading, "load"), (report, "build_report"), (train, "train"), (zoo, "build"),
                        (hf_zoo, "build"), (hf_zoo, "load"), (export, "export_release"),
                        (memory, "estimate_memory"), (remedy, "train_share"),
                        (report_paper, "paper_figures")):  # `paper --out`: its drawing, after the write rule
        monkeypatch.setattr(owner, name, stop)
    try:  # the one loading entry point, where the package has it
        import phaseinterp.models.loading as loading
    except ImportError:
        return
    monkeypatch.setattr(loading, "load", stop)


@pytest.mark.parametrize("verb", sorted(_cli_verbs()))
def test_fuzz_cli(verb, places, tmp_path, monkeypatch, capsys):
    from phaseinterp.cli import main

    parser = _cli_verbs()[verb]
    options = [a for a in parser._actions if a.option_strings and a.dest not in ("help",)]
    positionals = [a for a in parser._actions if not a.option_strings]
    _stop_work(monkeypatch)
    monkeypatch.chdir(tmp_path)
    before = _snapshot(places)

    @FUZZ
    @given(option=st.sampled_from(options + positionals), raw=st.sampled_from(CLI_VALUES))
    def run(option, raw):
        value = raw.format(**{k: str(places / k) for k in ("file", "user-folder", "result", "checkpoint",
                                                           "unwritable", "empty-folder")}) if "{" in raw else raw
        argv = verb.split()
        base = {"model": str(places / "checkpoint"), "name": "dsv4-tiny" if verb == "zoo export" else "w4s4",
                "dir": str(places / "empty-folder"), "stop": "2", "share": "0/1", "seeds": "0",
                "runs": str(tmp_path / "out")}
        for p in positionals:
            argv.append(value if p is option else base.get(p.dest, "x"))
        if option in options:
            if option.nargs == 0:
                argv.append(option.option_strings[-1])
            else:
                argv += [option.option_strings[-1], value]
        if verb == "zoo export" and option.dest != "layout":
            argv += ["--layout", "deepseek"]
        if verb == "zoo export" and option.dest != "out" or verb == "train" and option.dest != "out":
            argv += ["--out", str(tmp_path / "out")]
        _count(f"cli: {verb}")
        try:
            code = main(argv)
        except _Reached:
            code = "reached"
        except SystemExit as exit_info:  # argparse
            code = exit_info.code
        err = capsys.readouterr().err.strip()
        assert code in (0, 2, "reached"), (argv, code, err)
        if code == 2:
            lines = err.splitlines()
            assert len(lines) == 1 and lines[0].startswith("phaseinterp: error:"), (argv, err)
        assert _snapshot(places) == before, f"{argv} changed a user's files"
        if code == 2:
            assert not (tmp_path / "out").exists(), f"{argv} left an output folder"
        for child in list(tmp_path.iterdir()):
            shutil.rmtree(child) if child.is_dir() else child.unlink()

    run()


@pytest.fixture(scope="module", autouse=True)
def report_counts(request):
    """Prints how many inputs each class got in this process after the file's tests, captured or not (run the whole
    file to see them all). A fixture's teardown, not a test: it checks nothing."""
    yield
    with request.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
        print("\nfuzz inputs per class:", dict(sorted(COUNTS.items())))
