"""The fuzzer over saved results and checkpoints (issue 45, class 3): every kind of result the package
defines is saved once (`test_every_result_class_is_walked` keeps KINDS complete), then a drawn edit is
made to its ``meta.json`` or ``arrays.npz``, or to a nested result's (a sweep's runs, a grid's results):
a value out of its range, of the wrong type, null, an int field as a float, a deleted or unknown field,
an unreadable tagged value, a deleted top-level key, a nested result's entry garbled; an array deleted,
of another dtype or rank, shorter, with a negative count or an accuracy above 1; a table column deleted
or shorter. A small checkpoint's ``config.json`` leaf or weights bytes are edited too.

Every edit is refused on load in one line: a result whose hash is recorded by the hash ("was changed
after it was saved"), the same edit without the record (a save from 0.3) by the field's own check,
naming it; a checkpoint by its config or weights hash, and without the config hash by the config's
own checks where the value is impossible. Never a load with the edited value.

Bounded: the smallest model (2 layers, d_model 32, R = 8); ``derandomize=True`` with
``PHASEINTERP_FUZZ_EXAMPLES`` (default 12) x 8 edits per walk.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import typing
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jaxtyping import AbstractArray

from phaseinterp import CheckpointError, CompressedConfig, CompressedTransformer
from phaseinterp.errors import UserInputError
from phaseinterp.results import _range_of
from phaseinterp.tasks import KeyValueRetrieval
from conftest import CI
from typecheck import as_user

EXAMPLES = int(os.environ.get("PHASEINTERP_FUZZ_EXAMPLES", "12"))
FUZZ = settings(max_examples=EXAMPLES * 8, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
TASK = KeyValueRetrieval(seq_len=64, n_records=8, n_demos=2, min_distance=20, residue_modulus=8)
CFG = CompressedConfig(d_vocab=TASK.vocab.size, n_ctx=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1,
                       d_head=16, d_mlp=64, window=4, stride=4, local_window=8)
COUNTS: dict[str, int] = {}


def _count(key):
    COUNTS[key] = COUNTS.get(key, 0) + 1




def _dsv4_results(zoo_model):
    """The DeepSeek-V4 indexer experiments' results on the shipped ``dsv4-tiny`` (one prompt per residue);
    none when its checkpoint is missing (under CI=true conftest fails that instead)."""
    import phaseinterp as pi
    from phaseinterp.zoo import deepseek_v4 as hf_zoo

    if "dsv4-tiny" not in hf_zoo.available():
        if CI:
            pytest.fail("the shipped dsv4-tiny checkpoint is missing")
        return []
    model = zoo_model("dsv4-tiny")
    task = pi.zoo.task_for(model)
    prompts = task.generate(1, seed=0, strict=False)
    return [pi.indexer_phase(model, task, prompts=prompts), pi.force_target_selection(model, task, prompts=prompts)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory, zoo_model):
    """One saved folder per kind of result: {class name: (class, folder)}."""
    import phaseinterp as pi
    from phaseinterp import theory
    from phaseinterp.tasks import DocstringProbe
    from tests.test_remedy import _synthetic

    model = CompressedTransformer(CFG).eval()
    batch = TASK.generate(23, seed=0)
    ablation = pi.ablate(model, TASK, prompts=batch, n_calibration=8, progress=False)
    flat = [0.9, 0.9, 0.9, 0.9]
    induction = theory.IdealizedInductionModel(N=6, S=3, L=2, heads=2, gamma=2.0, beta=4.0)
    search = theory.global_search(induction, n_random=2, n_refine_best=1, steps=20)
    results = [
        pi.phase_profile(model, batch, progress=False, n_permutations=19),
        pi.phase_profile(model, TASK, n_per_residue=24, axis="both", progress=False, n_permutations=19),
        ablation,
        pi.gate_cycling_profile(model, TASK, shifts=(1, -1), prompts=batch, progress=False, n_boot=10),
        pi.gate_profile(model, TASK, prompts=batch),
        pi.gate_cycling_unit(model, TASK, shifts=(1, -1), layers=0, prompts=batch, n_calibration=8, n_boot=10,
                             progress=False),
        pi.conformance(model, TASK, ("decode",), n_per_residue=1, progress=False),
        DocstringProbe.synthetic(TASK.vocab, lengths=(24, 25, 26, 27)).run(model, TASK.vocab),
        pi.interventions.confirm(model, TASK, n_calibration=8, prompts=batch,
                                 nomination_prompts=TASK.generate(2, seed=2, strict=False), progress=False),
        pi.specialized_units(model, ablation=ablation),
        _synthetic({"baseline": {100: [0.9, 0.2, 0.9, 0.9]}, "staggered": {100: flat}},
                   {"baseline": [3], "staggered": [1, 3]}, {"baseline": [0.9, 0.2, 0.9, 0.9], "staggered": flat}),
        theory.gradient_flow(induction, rho=0.3, seed=0, t_max=1.0, stop_at=None),
        theory.flow_seeds(induction, [0, 1], rho=0.5, t_max=5, stop_at=0.9),
        search,
        theory.SearchGrid(results=[search]),
        *_dsv4_results(zoo_model),
        pi.paper.gates("kvc_w8s8_1kv_baseline"),
        pi.paper.cycling("kvc_w12s12_4kv"),
        pi.paper.compare(pi.paper.profile("kvc_w8s8_1kv_baseline"), "kvc_w8s8_1kv_baseline"),
    ]
    root = tmp_path_factory.mktemp("fuzz_saved")
    return {type(r).__name__: (type(r), r.save(root / type(r).__name__)) for r in results}


# Every result class (`test_every_result_class_is_walked` keeps the list complete).
KINDS = ["PhaseProfile", "TwoAxisProfile", "AblationResult", "CyclingResult", "GateProfile", "UnitCyclingResult",
         "ConformanceResult", "DocstringResult", "ConfirmResult", "UnitSelection", "RemedyResult", "FlowResult",
         "FlowSweep", "SearchResult", "SearchGrid", "IndexerPhaseResult", "ForcedSelectionResult", "PaperGates",
         "PaperCycling", "PaperComparison"]


def test_every_result_class_is_walked():
    """Every `Result` subclass the package defines (each module imported) is one of KINDS."""
    import importlib
    import pkgutil

    import phaseinterp
    from phaseinterp.results import _KINDS

    for info in pkgutil.walk_packages(phaseinterp.__path__, "phaseinterp."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError:  # an optional backend that is not installed defines no result class
            continue
    defined = {cls.__name__ for cls in _KINDS.values() if cls.__module__.startswith("phaseinterp.")}
    assert defined - set(KINDS) == set(), "a result class the saved-results fuzzer does not walk (add it to KINDS)"
    assert set(KINDS) - defined == set(), "KINDS names a class the package no longer has"


def _nested_folders(pristine):
    """The result's own folder and each nested result's (a sweep's runs, a grid's results), relative."""
    return sorted(p.parent.relative_to(pristine) for p in pristine.rglob("meta.json"))


def _kind_of(folder):
    from phaseinterp.results import _KINDS

    kind = json.loads((folder / "meta.json").read_text())["kind"]
    return next(cls for cls in _KINDS.values() if cls.__name__ == kind)


def _hints(cls):
    return typing.get_type_hints(cls)


def _optional(hint):
    return hint is typing.Any or type(None) in typing.get_args(hint)


def _required(cls):
    import dataclasses

    return {f.name for f in dataclasses.fields(cls) if f.init and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING}


def _wrong_type(value):
    """A JSON value of another type than ``value`` (and not a tagged one that decodes to the same type)."""
    if isinstance(value, bool):
        return "yes"
    if isinstance(value, (int, float)) or (isinstance(value, dict) and "__float__" in value):
        return "0.5"
    if isinstance(value, str):
        return [value]
    if value is None:
        return "x"
    return 7


# ------------------------------------------------------------------ edits of a saved result
def _field_edits(cls, meta):
    """(edit name, field) pairs that make an impossible meta.json for ``cls``."""
    hints, fields = _hints(cls), meta["fields"]
    edits = []
    for name, value in fields.items():
        hint = hints.get(name)
        if hint is None or hint is typing.Any:
            continue
        edits.append(("wrong type", name))
        if value is not None and not _optional(hint):
            edits.append(("null", name))
        if hint is int and isinstance(value, int):
            edits.append(("int as float", name))
        if _range_of(name) is not None and (value is None or isinstance(value, (int, float, dict))):
            edits.append(("out of range", name))
        if name in _required(cls):
            edits.append(("deleted field", name))
        edits.append(("unreadable tag", name))
    edits += [("unknown field", "zzz_added"), ("top-level key", "fields"), ("top-level key", "arrays"),
              ("top-level key", "kind"), ("top-level key", "format"), ("fields a list", "fields")]
    for name in meta.get("results", {}):  # a sweep's runs, a grid's results: their entry in meta.json
        edits += [("nested kinds garbage", name), ("nested kind unknown", name)]
    return edits


def _array_edits(cls, meta, arrays):
    hints = _hints(cls)
    edits = []
    for name in meta["arrays"]:
        a = arrays[name]
        edits += [("deleted array", name), ("strings for numbers", name), ("one more axis", name)]
        if a.ndim == 1 and a.size > 1 and name in ("residue_n", "residue_correct", "phase_n", "phase_correct"):
            edits.append(("one shorter", name))
        if a.size and _range_of(name) is not None and a.dtype.kind in "iuf":
            edits.append(("out of range array", name))
        if a.size and a.dtype.kind in "iu" and hints.get(name) is not None:
            edits.append(("NaN in an int array", name))
    for frame, spec in meta["frames"].items():
        edits.append(("deleted column", f"{frame}/0"))
        if len(spec["columns"]) > 1 and len(arrays[f"{frame}/0"]) > 1:
            edits.append(("column one shorter", f"{frame}/0"))
        edits.append(("table spec garbage", frame))
    return edits


def _apply_array(edit, target, arrays):
    a = arrays[target]
    arrays[target] = {"strings for numbers": lambda: np.full(a.shape, "x"), "one more axis": lambda: a[None],
                      "NaN in an int array": lambda: np.where(np.arange(a.size).reshape(a.shape) == 0, np.nan,
                                                              a.astype(np.float64))}[edit]()


def _apply(edit, target, meta, arrays, draw, hint=None):
    """Edit ``meta`` / ``arrays`` in place; returns the words the refusal must contain (None: the edit is
    covered by the recorded hash only)."""
    fields = meta["fields"]
    if edit == "wrong type":
        fields[target] = _wrong_type(fields[target])
        return rf"{target}=.* is not "
    if edit == "null":
        fields[target] = None
        return rf"{target}=None is not "
    if edit == "int as float":
        fields[target] = fields[target] + 0.5
        return rf"{target}=[-\d.]+ is not int"
    if edit == "out of range":
        low, high, _ = _range_of(target)
        bad = [low - 1, -3, high + 1, 7.0] if high < float("inf") else [int(low) - 1, -1, -5]  # a size of 0, a count of -1
        if target == "confidence":
            bad += [0.0, 1.0]
        value = draw(st.sampled_from(bad), label="value")
        fields[target] = value
        return rf"{target}={float(value)!r} is out of range"
    if edit == "deleted field":
        del fields[target]
        return rf"lacks the field\(s\) \['{target}'\]"
    if edit == "unreadable tag":
        fields[target] = draw(st.sampled_from([{"__float__": "abc"}, {"__tuple__": 5}, {"__what__": 1},
                                                {"__ndarray__": [1], "dtype": "nosuch"}, {"__items__": [[1]]}]),
                              label="tag")
        return rf"field '{target}' holds an unreadable value"
    if edit == "unknown field":
        fields[target] = 1
        return r"unknown fields \['zzz_added'\]"
    if edit == "top-level key":
        del meta[target]
        return {"fields": r"'fields' is NoneType, not a dict", "arrays": r"'arrays' is NoneType, not a list",
                "kind": r"does not hold a \w+ \(kind=None\)", "format": r"unsupported format None"}[target]
    if edit == "fields a list":
        meta["fields"] = list(fields.items())
        return r"'fields' is list, not a dict"
    if edit == "nested kinds garbage":
        meta["results"][target]["kinds"] = draw(st.sampled_from([5, None, "x"]), label="kinds")
        return rf"results entry '{target}' has no list of kinds"
    if edit == "nested kind unknown":
        meta["results"][target]["kinds"][0] = draw(st.sampled_from(["nosuch.Result", 5, None]), label="kind")
        return r"holds a \S+, not a known result class"
    a = arrays.get(target)
    shaped = isinstance(hint, type) and issubclass(hint, AbstractArray)
    if edit in ("strings for numbers", "one more axis", "NaN in an int array") and not shaped:
        _apply_array(edit, target, arrays)
        return None  # a bare np.ndarray annotation says no dtype or rank: only the recorded hash covers it
    if edit in ("deleted array", "deleted column"):
        del arrays[target]
        return r"lacks the array"
    if edit == "strings for numbers":
        arrays[target] = np.full(a.shape, "x")
        return rf"{target}=an array of <U1 .* is not"
    if edit == "one more axis":
        arrays[target] = a[None]
        return rf"{target}=an array of .* is not"
    if edit == "one shorter":
        arrays[target] = a[:-1]
        return r"entries along '(residue|phase)'|expected \d+ residues and \d+ phases"
    if edit == "out of range array":
        low, high, _ = _range_of(target)
        a = a.astype(np.float64 if a.dtype.kind == "f" else a.dtype).copy()
        a.flat[draw(st.integers(0, a.size - 1), label="at")] = -1 if high == float("inf") else 1.5
        arrays[target] = a
        return rf"{target}=[-\d.]+ is out of range"
    if edit == "NaN in an int array":
        b = a.astype(np.float64)
        b.flat[0] = np.nan
        arrays[target] = b
        return rf"{target}=an array of float64 .* is not"
    if edit == "column one shorter":
        arrays[target] = a[:-1]
        return rf"the table '{target.split('/')[0]}' does not read back"
    if edit == "table spec garbage":
        meta["frames"][target]["columns"] = 5
        return rf"the table '{target}' does not read back"
    raise AssertionError(edit)


def _write(folder, meta, arrays):
    (folder / "meta.json").write_text(json.dumps(meta))
    np.savez(folder / "arrays.npz", **arrays)


def _edit_and_load(cls, pristine, folder, edit, target, draw, sub=Path(".")):
    """Copy the saved ``pristine`` to ``folder``, make ``edit`` to ``target`` in its result at ``sub`` (itself,
    or a nested result's folder), then load it as ``cls``: refused by the recorded hash, then (the record
    removed) by the field's own check, in one line naming what the edit broke."""
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(pristine, folder)
    edited = folder / sub
    meta = json.loads((edited / "meta.json").read_text())
    with np.load(edited / "arrays.npz", allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    recorded = meta.get("content_sha256")
    words = _apply(edit, target, meta, arrays, draw, typing.get_type_hints(_kind_of(pristine / sub)).get(target))
    _count(f"result: {edit}" + (" (hash only)" if words is None else ""))
    _count(f"kind: {cls.__name__}" + ("" if sub == Path(".") else " (nested)"))
    assert recorded is not None
    meta["content_sha256"] = recorded
    _write(edited, meta, arrays)
    with as_user(), pytest.raises(UserInputError,
                                   match="was changed after it was saved|does not hold a|unsupported format"):
        cls.load(folder)
    if words is None:
        return
    meta.pop("content_sha256")  # the same edit in a save without the record (0.3): the field's own check
    _write(edited, meta, arrays)
    with as_user(), pytest.raises(UserInputError) as caught:
        cls.load(folder)
    text = str(caught.value)
    assert "\n" not in text and re.search(words, text), (cls.__name__, edit, target, text)


@pytest.mark.parametrize("kind", KINDS)
def test_each_result_round_trips_and_the_issues_instance_is_refused(kind, saved, tmp_path):
    """The round trip holds (the checks refuse nothing a save writes); a p-value of 7 and a confidence
    of -3 (the issue's instance) are refused where the result has them."""
    if kind not in saved:
        pytest.skip("needs the shipped dsv4-tiny checkpoint")
    cls, pristine = saved[kind]
    assert cls.load(pristine) == cls.load(pristine)
    meta = json.loads((pristine / "meta.json").read_text())
    for field, value in (("period_p_value", 7.0), ("confidence", -3)):
        if field in meta["fields"]:
            _edit_and_load(cls, pristine, tmp_path / "e", "out of range", field, lambda s, label, value=value: value)


@FUZZ
@given(kind=st.sampled_from(KINDS), data=st.data())
def test_an_edited_saved_result_is_refused_naming_what_changed(kind, data, saved, tmp_path):
    """A drawn kind of result, a drawn folder of it (its own, or a nested result's), a drawn edit."""
    assume(kind in saved)  # the DeepSeek-V4 kinds need the shipped dsv4-tiny
    cls, pristine = saved[kind]
    sub = data.draw(st.sampled_from(_nested_folders(pristine)), label="folder")
    meta = json.loads((pristine / sub / "meta.json").read_text())
    with np.load(pristine / sub / "arrays.npz", allow_pickle=False) as stored:
        arrays = {k: stored[k] for k in stored.files}
    nested = _kind_of(pristine / sub)
    edit, target = data.draw(st.sampled_from(_field_edits(nested, meta) + _array_edits(nested, meta, arrays)),
                             label="edit")
    _edit_and_load(cls, pristine, tmp_path / "edited", edit, target, data.draw, sub)


# ------------------------------------------------------------------ edits of a checkpoint
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz_saved_ckpt") / "model"
    model = CompressedTransformer(CFG)
    model.metadata.update(task=TASK.to_dict(), task_type="KeyValueRetrieval")
    model.save_pretrained(path)
    return path


def _leaves(config, prefix=()):
    for key, value in config.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, prefix + (key,))
        else:
            yield prefix + (key,)


def _other(value, draw):
    """A drawn value other than ``value``: a near one of the same type (shapes kept where it is a size), or
    one of another type, or null."""
    if isinstance(value, bool):
        near = [not value]
    elif isinstance(value, int):
        near = [value + 1, value - 1, 0, -value - 1]
    elif isinstance(value, float):
        near = [value * 2 + 1, -1.0, float("nan")]
    elif isinstance(value, str):
        near = [value + "x", ""]
    else:
        near = [[1], {"a": 1}]
    other = [c for c in near + ["0", None, [value]] if type(c) is not type(value) or c != value]  # a real change
    return draw(st.sampled_from(other), label="value")


CHECKPOINT_REFUSALS = (r"was changed after it was saved|does not match its recorded SHA-256|has \d+ bytes but the "
                       r"config records|lacks the field|unsupported checkpoint format|holds a \w+, not a checkpoint")


def _load_refused(folder, words):
    from phaseinterp import load

    for loader in (CompressedTransformer.from_pretrained, load):
        with as_user(), pytest.raises((CheckpointError, UserInputError)) as caught:
            loader(folder)
        text = str(caught.value)
        assert "\n" not in text and re.search(words, text), text


@FUZZ
@given(data=st.data())
def test_an_edited_checkpoint_is_refused_by_its_hashes(checkpoint, data, tmp_path):
    folder = tmp_path / "edited"
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(checkpoint, folder)
    config = json.loads((folder / "config.json").read_text())
    target = data.draw(st.sampled_from(["config leaf", "deleted config leaf", "weights byte", "weights cut",
                                        "weights grown"]), label="edit")
    _count(f"checkpoint: {target}")
    if target in ("config leaf", "deleted config leaf"):
        # (deleting config_sha256 alone leaves the config as saved: a 0.3 checkpoint, which loads)
        leaves = [p for p in sorted(_leaves(config)) if not (target == "deleted config leaf" and p == ("config_sha256",))]
        path = data.draw(st.sampled_from(leaves), label="leaf")
        holder = config
        for key in path[:-1]:
            holder = holder[key]
        if target == "config leaf":
            holder[path[-1]] = _other(holder[path[-1]], data.draw)
        else:
            del holder[path[-1]]
        (folder / "config.json").write_text(json.dumps(config))
    else:
        blob = bytearray((folder / "model.safetensors").read_bytes())
        if target == "weights byte":
            at = data.draw(st.integers(0, len(blob) - 1), label="at")
            blob[at] ^= 1 << data.draw(st.integers(0, 7), label="bit")
        elif target == "weights cut":
            blob = blob[: data.draw(st.integers(0, len(blob) - 1), label="kept")]
        else:
            blob += b"\0" * data.draw(st.integers(1, 64), label="added")
        (folder / "model.safetensors").write_bytes(bytes(blob))
    _load_refused(folder, CHECKPOINT_REFUSALS)


IMPOSSIBLE_CONFIG = {"window": [0, -4, "4", 4.5], "stride": [0, -1, None], "local_window": [-1, "8"],
                     "d_head": [0, -16, 16.0], "n_heads": [0, 3], "n_kv_heads": [0, 3], "n_layers": [-1, "2"],
                     "d_vocab": [0, -5], "n_ctx": [0, -64], "gate": ["nosuch", 5]}


@FUZZ
@given(data=st.data())
def test_an_impossible_config_without_its_hash_is_refused(checkpoint, data, tmp_path):
    """A checkpoint config without ``config_sha256`` (written by 0.3): an impossible value is refused by the
    config's own checks, naming the field."""
    folder = tmp_path / "edited"
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(checkpoint, folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("config_sha256")
    field = data.draw(st.sampled_from(sorted(IMPOSSIBLE_CONFIG)), label="field")
    config["model"][field] = data.draw(st.sampled_from(IMPOSSIBLE_CONFIG[field]), label="value")
    _count(f"checkpoint without its hash: {field}")
    (folder / "config.json").write_text(json.dumps(config))
    _load_refused(folder, rf"{field}|does not fit the model")


@pytest.fixture(scope="module", autouse=True)
def report_counts(request):
    """Prints how many edits of each kind this process drew after the file's tests, captured or not (run the whole
    file to see them all). A fixture's teardown, not a test: it checks nothing."""
    yield
    with request.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
        print(f"\nedits drawn: {sum(COUNTS.values())}", dict(sorted(COUNTS.items())))
