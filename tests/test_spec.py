"""Experiments as (validated spec, records, result): each experiment's options are one spec, checked
once when it is made, filled alike from Python keywords, a ready ``spec=`` and the command line."""

from __future__ import annotations

import dataclasses
import inspect
import warnings

import numpy as np
import pandas as pd
import pytest

import phaseinterp as pi
from phaseinterp._checks import Spec, experiment
from phaseinterp.cli.args import build_parser
from phaseinterp.errors import UserInputError

EXPERIMENTS = {  # the function, its spec
    "phase_profile": (pi.phase_profile, pi.ProfileSpec),
    "engine_profile": (pi.engine_profile, pi.ProfileSpec),
    "ablate": (pi.ablate, pi.AblationSpec),
    "gate_cycling_profile": (pi.gate_cycling_profile, pi.CyclingSpec),
    "gate_cycling_unit": (pi.gate_cycling_unit, pi.UnitCyclingSpec),
    "conformance": (pi.conformance, pi.ConformanceSpec),
    "gate_profile": (pi.gate_profile, pi.GateProfileSpec),
    "specialized_units": (pi.specialized_units, pi.SelectionSpec),
    "confirm": (pi.interventions.confirm, pi.interventions.ConfirmSpec),
    "replacement_ablation": (pi.interventions.replacement_ablation, pi.interventions.ReplacementSpec),
    "indexer_phase": (pi.indexer_phase, pi.IndexerSpec),
    "force_target_selection": (pi.force_target_selection, pi.IndexerSpec),
}


@pytest.fixture(scope="module")
def w4s4():
    return pi.load("w4s4")


def _unhooked(fn):
    """The experiment ``fn`` as a user calls it: without the suite's type hook, which wraps its body
    (inside `experiment`) and would stop some bad values before the spec names them."""
    return experiment(fn.__spec_type__)(inspect.unwrap(fn))


def _default(field):
    return field.default if field.default is not dataclasses.MISSING else field.default_factory()


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_an_experiment_s_options_are_its_spec_s_fields_with_the_same_defaults(name):
    fn, spec_type = EXPERIMENTS[name]
    params = inspect.signature(fn).parameters
    assert fn.__spec_type__ is spec_type
    assert "spec" in params and params["spec"].default is None
    for field in dataclasses.fields(spec_type):
        assert params[field.name].default == _default(field), (name, field.name)
    required = {"layers": [0]} if spec_type is pi.UnitCyclingSpec else {}  # the unit has no default
    assert spec_type(**required) == spec_type(**required), "a spec of defaults is valid and compares by value"


def test_a_function_whose_options_drift_from_its_spec_is_refused_when_its_module_loads():
    with pytest.raises(TypeError, match="option n_per_residue must default to ProfileSpec.n_per_residue's default 72"):
        @experiment(pi.ProfileSpec)
        def drifted(model, *, n_per_residue: int = 1, spec=None):  # noqa: ARG001 - the drift is the test
            ...
    with pytest.raises(TypeError, match="must take spec="):
        @experiment(pi.ProfileSpec)
        def no_spec(model):  # noqa: ARG001
            ...


# ------------------------------------------------------------------ the same run from either form
# Options that differ from the defaults, one set per experiment: the keywords and ``spec=`` of them.
OPTIONS = {
    "phase_profile": dict(seed=3, n_per_residue=72, progress=False),
    "engine_profile": dict(stride=4, n_per_residue=77, axis="length", hold=2, progress=False),
    "ablate": dict(layer=1, n_calibration=48, progress=False),
    "gate_cycling_profile": dict(shifts=[1], layers=[1], progress=False),
    "gate_cycling_unit": dict(shifts=[1], layers=[1], kv_heads=[0], n_calibration=48, progress=False),
    "conformance": dict(modes=["decode"], n_per_residue=2, progress=False),
    "gate_profile": dict(n_per_residue=2, seed=5),
    "specialized_units": dict(max_phases=2),
    "confirm": dict(n_calibration=8, methods=["mean", "resample"], cycling=False, progress=False),
    "replacement_ablation": dict(method="norm_matched", n_calibration=8),
    "indexer_phase": dict(layers=[1], n_per_residue=77, seed=2),
    "force_target_selection": dict(layers=1, batch_size=8),
}


def _wrappers(fn):
    """``fn`` and each function it wraps (``__wrapped__``), outermost first."""
    chain = [fn]
    while hasattr(chain[-1], "__wrapped__"):
        chain.append(chain[-1].__wrapped__)
    return chain


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_an_experiment_from_a_spec_runs_its_body_as_the_keywords_do(name):
    """The keywords and ``spec=`` of them reach the experiment's body as the same arguments: the same
    spec (by value) and each option as that spec holds it (normalized). The body the probe wraps stands
    in for the experiment's own (its signature), under the same `experiment` wrapper the public function
    goes through; so two runs of the experiment, one from each form, would compute the same thing."""
    fn, spec_type = EXPERIMENTS[name]
    options = OPTIONS[name]

    def body(*args, **kwargs):
        return args, kwargs

    body.__signature__ = inspect.signature(inspect.unwrap(fn))
    probe = experiment(spec_type)(body)
    assert any(f.__code__ is probe.__code__ for f in _wrappers(fn)), f"{name} does not go through experiment()"
    model, task = object(), object()
    by_keywords = probe(model, task, **options)
    by_spec = probe(model, task, spec=spec_type(**options))
    assert by_keywords == by_spec
    received = inspect.signature(body).bind(*by_keywords[0], **by_keywords[1]).arguments
    kwargs = {**received.pop("kwargs", {}), **received}
    assert kwargs[list(kwargs)[0]] is model and kwargs["task"] is task
    assert kwargs["spec"] == spec_type(**options)
    for field in dataclasses.fields(spec_type):
        assert kwargs[field.name] == getattr(kwargs["spec"], field.name), (name, field.name)
    assert {k: kwargs[k] for k in options} != {k: _default(f) for f in dataclasses.fields(spec_type)
                                              for k in options if f.name == k}, "the options are all defaults"


@pytest.fixture(scope="module")
def small_task(w4s4):
    """The zoo task shrunk (64 tokens, R = 8): 24 prompts per residue moment-match in a fraction of a second."""
    return dataclasses.replace(pi.zoo.task_for(w4s4), seq_len=64, n_records=12, n_demos=2, residue_modulus=8,
                               min_distance=20)


def test_phase_profile_is_its_spec_s_three_steps(w4s4, small_task):
    """spec -> prompts -> records -> result by hand give ``phase_profile(spec=)``'s numbers."""
    spec = pi.ProfileSpec(seed=3, n_per_residue=24, progress=False)
    by_spec = pi.phase_profile(w4s4, small_task, spec=spec)
    from phaseinterp.profile import profile_records

    stride = spec.stride_of(w4s4)
    batch = spec.prompts(small_task, stride)
    records = profile_records(w4s4, batch, spec, stride)
    pd.testing.assert_frame_equal(records, by_spec.records)
    result = spec.result(records, batch.residue_modulus, stride, by_spec.label)
    np.testing.assert_array_equal(result.phase_accuracy, by_spec.phase_accuracy)
    assert result.period_p_value == by_spec.period_p_value


def test_the_unit_selection_refuses_a_sweep_option_beside_a_ready_ablation(w4s4, small_task):
    ablation = pi.ablate(w4s4, small_task, layer=1, prompts=small_task.generate(2, seed=0, strict=False),
                         n_calibration=48, progress=False)
    with pytest.raises(UserInputError, match="n_calibration=300 does not apply here: ablation= is the sweep"):
        pi.specialized_units(w4s4, ablation=ablation, spec=pi.SelectionSpec(n_calibration=300))


def test_engine_profile_is_the_in_process_profile_and_takes_the_engine_options(w4s4, small_task):
    engine = pi.engines.CacheEngine(w4s4)
    task = small_task
    served = pi.engine_profile(engine, task, stride=4, n_per_residue=24, progress=False)
    here = pi.phase_profile(w4s4, task, n_per_residue=24, progress=False)
    np.testing.assert_array_equal(served.records["predicted"], here.records["predicted"])
    with pytest.raises(UserInputError, match=r"is an engine .* phaseinterp\.engine_profile"):  # one door each
        pi.phase_profile(engine, task, stride=4, n_per_residue=72, progress=False)
    assert "retries" not in inspect.signature(pi.phase_profile).parameters
    with pytest.raises(TypeError, match="phase_profile\\(\\) got an unexpected keyword argument 'retries'"):
        pi.phase_profile(engine, task, stride=4, retries=1)
    assert {"resume_dir", "retries", "retry_wait"} <= set(inspect.signature(pi.engine_profile).parameters)


# ------------------------------------------------------------------ checked once, before any work
class _Counting:
    """Counts forwards of the model it wraps (a hook on its first block)."""

    def __init__(self, model):
        self.calls = 0
        self.handle = model.blocks[0].register_forward_hook(lambda *_: setattr(self, "calls", self.calls + 1))


@pytest.mark.parametrize("options, match", [
    (dict(interval="bootstrap"), "interval='bootstrap' is not one of"),
    (dict(confidence=1.5), "confidence=1.5 must be a number in (0, 1)"),
    (dict(n_permutations=0), "n_permutations=0"),
    (dict(hold=3), "hold= applies to axis='length' only"),
    (dict(batch_size=0), "batch_size=0"),
    (dict(seed=-1), "seed=-1"),
    (dict(label=3), "label=3 must be a string"),
])
def test_a_bad_profile_option_is_refused_by_the_spec_before_a_forward(w4s4, options, match):
    counter = _Counting(w4s4)
    try:
        with pytest.raises(UserInputError, match=match.replace("(", r"\(").replace(")", r"\)")):
            _unhooked(pi.phase_profile)(w4s4, progress=False, **options)
        with pytest.raises(UserInputError, match=match.replace("(", r"\(").replace(")", r"\)")):
            pi.ProfileSpec(**options)
    finally:
        counter.handle.remove()
    assert counter.calls == 0


@pytest.mark.parametrize("spec_type, options, match", [
    (pi.AblationSpec, dict(method="slow"), "method='slow'"),
    (pi.AblationSpec, dict(scope="head"), "scope='head'"),
    (pi.CyclingSpec, dict(mode="static", branch="k"), "mode='static' moves the K and V gates together"),
    (pi.CyclingSpec, dict(shifts=[]), "shifts=[] must be a non-empty list"),
    (pi.CyclingSpec, dict(shifts=[1.5]), "1.5"),
    (pi.UnitCyclingSpec, dict(), "name it with layers="),
    (pi.UnitCyclingSpec, dict(layers=[0], measure="kl"), "measure='kl'"),
    (pi.ConformanceSpec, dict(modes=["prefill"]), "mode 'prefill' is not one of"),
    (pi.ConformanceSpec, dict(modes=["decode", "decode"]), "repeats a mode"),
    (pi.ConformanceSpec, dict(tolerance={"decode": -1.0}), "tolerance['decode']=-1 must be > 0"),
    (pi.GateProfileSpec, dict(n_per_residue=0), "n_per_residue=0 is out of range (valid: 1..500000)"),
    (pi.SelectionSpec, dict(max_phases=0), "max_phases=0 must be an integer >= 1"),
    (pi.interventions.ConfirmSpec, dict(alpha=1.0), "alpha=1.0 must be a number in (0, 1)"),
    (pi.interventions.ConfirmSpec, dict(alpha="0.05"), "alpha='0.05' must be a number in (0, 1)"),
    (pi.interventions.ConfirmSpec, dict(methods=["resample"]), "must include 'mean'"),
    (pi.interventions.ConfirmSpec, dict(methods=["mean", "mean"]), "each once"),
    (pi.interventions.ConfirmSpec, dict(max_concentration=0.5), "max_concentration=0.5 must be >= 1 or None (W/2)"),
    (pi.interventions.ConfirmSpec, dict(nomination_seed=0), "seed=0 and nomination_seed=0 must differ"),
    (pi.interventions.ConfirmSpec, dict(correction="bonferroni"), "correction='bonferroni' is not one of"),
    (pi.interventions.ReplacementSpec, dict(method="zero"), "method='zero' is not one of"),
    (pi.IndexerSpec, dict(layers=[1, 1]), "layers=[1, 1] repeats a layer"),
    (pi.IndexerSpec, dict(layers=[1.0]), "layers=1.0 must be an integer"),
    (pi.IndexerSpec, dict(confidence=True), "confidence=True must be a number in (0, 1)"),
])
def test_each_spec_names_the_bad_option(spec_type, options, match):
    with pytest.raises(UserInputError) as info:
        spec_type(**options)
    assert match in str(info.value), str(info.value)


def test_model_checks_read_only_the_config(w4s4):
    """`check_model` needs ``cfg`` alone: the command line runs it on a checkpoint's config.json."""
    from types import SimpleNamespace

    described = SimpleNamespace(cfg=w4s4.cfg)
    with pytest.raises(UserInputError, match=r"layer=5 is out of range for a 2-layer model \(0..1\)"):
        pi.AblationSpec(layer=5).check_model(described)
    with pytest.raises(UserInputError, match="shift=4 is 0 mod S=4"):
        pi.CyclingSpec(shifts=[4]).check_model(described)
    with pytest.raises(UserInputError, match="kv_heads=3 is out of range"):
        pi.UnitCyclingSpec(layers=[0], kv_heads=[3]).check_model(described)
    with pytest.raises(UserInputError, match="chunk=6 must be a multiple of the cut period 4"):
        pi.ConformanceSpec(chunk=6).check_model(described)
    with pytest.raises(UserInputError, match=r"heads=\[\[0, 9\]\]: query head ids must be in 0..3"):
        pi.AblationSpec(heads=[[0, 9]]).check_model(described)
    with pytest.raises(UserInputError, match=r"layer=2 is out of range for a 2-layer model"):
        pi.SelectionSpec(layers=[2]).check_model(described)
    with pytest.raises(UserInputError, match="indexer_phase: the model has no indexer"):
        pi.IndexerSpec().check_model(described)
    twin = SimpleNamespace(cfg=pi.load("full").cfg)
    for spec in (pi.GateProfileSpec(), pi.SelectionSpec(), pi.interventions.ConfirmSpec()):
        with pytest.raises(UserInputError, match="full-attention model"):
            spec.check_model(twin)
    task = pi.zoo.task_for(w4s4)
    with pytest.raises(UserInputError, match="n_calibration=10 is out of range"):
        pi.AblationSpec(n_calibration=10).check_task(task)
    with pytest.raises(UserInputError, match="cannot fold R=24 residues to stride=5"):
        pi.ProfileSpec().check_task(task, 5)
    for spec_type in (pi.SelectionSpec, pi.interventions.ConfirmSpec, pi.interventions.ReplacementSpec):
        with pytest.raises(UserInputError, match="n_calibration=10 is out of range"):
            spec_type(n_calibration=10).check_task(task)


def test_options_beside_a_spec_are_refused_and_the_spec_must_be_the_experiment_s(w4s4):
    spec = pi.ProfileSpec(progress=False)
    with pytest.raises(UserInputError, match=r"seed= given beside spec=: set it in the spec instead \(spec.replace"):
        pi.phase_profile(w4s4, spec=spec, seed=2)
    with pytest.raises(UserInputError, match="spec=AblationSpec is not a ProfileSpec"):
        _unhooked(pi.phase_profile)(w4s4, spec=pi.AblationSpec())
    with pytest.raises(UserInputError, match="ProfileSpec has no option seeds"):
        spec.replace(seeds=2)
    with pytest.raises(UserInputError, match="interval='x'"):
        spec.replace(interval="x")  # replace checks again
    assert spec.replace(seed=2).seed == 2 and spec.seed == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.seed = 4


def test_a_sharded_run_takes_the_spec_its_single_function_takes(w4s4, small_task, tmp_path):
    task = small_task
    spec = pi.ProfileSpec(n_per_residue=24, progress=False)
    sharded = pi.parallel.sharded_profile(w4s4, task, out_dir=tmp_path / "a", chunk_size=80, spec=spec)
    single = pi.phase_profile(w4s4, task, spec=spec)
    np.testing.assert_array_equal(sharded.records["correct"], single.records["correct"])
    with pytest.raises(UserInputError, match="seed= given beside spec="):
        pi.parallel.sharded_profile(w4s4, task, out_dir=tmp_path / "b", spec=spec, seed=1)
    with pytest.raises(UserInputError, match="spec=AblationSpec is not a ProfileSpec"):
        pi.parallel.sharded_profile(w4s4, task, out_dir=tmp_path / "c", spec=pi.AblationSpec())


# ------------------------------------------------------------------ the command line fills the spec
@pytest.mark.parametrize("argv, spec", [
    (["profile", "w4s4", "--seed", "2", "--n-per-residue", "77", "--label", "x"],
     pi.ProfileSpec(seed=2, n_per_residue=77, label="x")),
    (["profile", "w4s4", "--axis", "length", "--hold", "3"], pi.ProfileSpec(axis="length", hold=3)),
    (["ablate", "w4s4", "--layer", "1", "--scope", "layer", "--n-calibration", "48", "--method", "naive"],
     pi.AblationSpec(layer=[1], scope="layer", n_calibration=48, method="naive")),
    (["cycle", "w4s4", "--shifts", "1", "2", "--layer", "0", "--mode", "static"],
     pi.CyclingSpec(shifts=[1, 2], layers=[0], mode="static")),
    (["cycle", "w4s4", "--score", "unit", "--layer", "1", "--kv-heads", "0", "--measure", "accuracy"],
     pi.UnitCyclingSpec(layers=[1], kv_heads=[0], measure="accuracy")),
    (["conformance", "w4s4", "--modes", "decode", "--chunk", "8", "--n-per-residue", "3"],
     pi.ConformanceSpec(modes=("decode",), chunk=8, n_per_residue=3)),
    (["gates", "w4s4", "--n-per-residue", "3"], pi.GateProfileSpec(n_per_residue=3)),
])
def test_the_command_line_fills_the_experiment_s_spec(argv, spec):
    from phaseinterp.cli.commands import _preflight

    args = build_parser().parse_args(argv)
    _preflight(args)
    got = args.spec
    if isinstance(got, pi.CyclingSpec | pi.UnitCyclingSpec):  # cycle's size is the default filled in
        got = got.replace(n_per_residue=spec.n_per_residue)
    assert got == spec


@pytest.mark.parametrize("argv, call", [
    (["ablate", "w4s4", "--n-calibration", "10"], lambda m: pi.ablate(m, n_calibration=10)),
    (["cycle", "w4s4", "--shifts", "4"], lambda m: pi.gate_cycling_profile(m, shifts=[4])),
    (["conformance", "w4s4", "--chunk", "6"], lambda m: pi.conformance(m, pi.zoo.task_for(m), chunk=6)),
    (["profile", "w4s4", "--n-per-residue", "73"], lambda m: pi.phase_profile(m, n_per_residue=73)),
    (["gates", "full"], lambda m: pi.gate_profile(pi.load("full"))),
])
def test_a_bad_option_reads_the_same_from_the_shell_and_from_python(w4s4, argv, call, capsys):
    from phaseinterp.cli import _one_line, main

    with pytest.raises(UserInputError) as info:
        call(w4s4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(argv) == 2
    assert capsys.readouterr().err == f"phaseinterp: error: {_one_line(info.value)}\n"  # the same check, one line


def test_spec_is_the_core_s_and_every_experiment_spec_is_public():
    assert issubclass(pi.ProfileSpec, Spec)
    for name in ("ProfileSpec", "AblationSpec", "CyclingSpec", "UnitCyclingSpec", "ConformanceSpec", "GateProfileSpec",
                 "SelectionSpec", "IndexerSpec"):
        assert name in pi.__all__ and issubclass(getattr(pi, name), Spec)


def test_a_spec_s_size_beside_ready_prompts_is_refused_as_the_keyword_is(w4s4):
    """`applies_only` refuses ``n_per_residue=`` beside ready prompts; a spec carrying a size there is refused
    with the same words, not silently ignored."""
    batch = pi.zoo.task_for(w4s4).generate(72, seed=0)
    cases = [
        (pi.phase_profile, pi.ProfileSpec(n_per_residue=80, progress=False), dict(task=batch), "task= is a ready TaskBatch"),
        (pi.ablate, pi.AblationSpec(n_per_residue=80, progress=False), dict(prompts=batch), "prompts= gives the prompts"),
        (pi.gate_cycling_profile, pi.CyclingSpec(shifts=[1], n_per_residue=80, progress=False), dict(prompts=batch),
         "prompts= gives the prompts"),
        (pi.gate_cycling_unit, pi.UnitCyclingSpec(shifts=[1], layers=[1], n_per_residue=80, progress=False),
         dict(prompts=batch), "prompts= gives the prompts"),
    ]
    for fn, spec, given, why in cases:
        with pytest.raises(UserInputError, match=f"n_per_residue=80 does not apply here: {why}"):
            fn(w4s4, spec=spec, **given)
        with pytest.raises(UserInputError, match=f"n_per_residue=80 does not apply here: {why}"):
            fn(w4s4, n_per_residue=80, **given, **{k: v for k, v in spec.options(changed_only=True).items()
                                                     if k != "n_per_residue"})
