"""Every bad input is a clear error: exit code 2 and one line naming the value (CLI), or a
ValueError / CheckpointError naming it (API); checked before any work, leaving no partial output.

Table-driven: each row is one distinct bad input. CLI rows write (if they wrote anything) to a
fresh ``{out}`` folder, which must not exist afterwards; rows whose bad value is a file check
that the file is unchanged.
"""

from __future__ import annotations

import dataclasses
import functools

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from phaseinterp import CheckpointError, CompressedConfig, CompressedTransformer
from phaseinterp._checks import experiment
from phaseinterp.cli import main
from phaseinterp.tasks import KeyValueRetrieval
from typecheck import as_user

TASK = KeyValueRetrieval(seq_len=64, n_records=8, n_demos=2, min_distance=20, residue_modulus=8)
CFG = CompressedConfig(d_vocab=TASK.vocab.size, n_ctx=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1,
                       d_head=16, d_mlp=64, window=4, stride=4, local_window=8)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("bad_inputs") / "model"
    model = CompressedTransformer(CFG)
    model.metadata.update(task=TASK.to_dict(), task_type="KeyValueRetrieval")
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def model(checkpoint):
    return CompressedTransformer.from_pretrained(checkpoint).eval()


@pytest.fixture(scope="module")
def train_run(tmp_path_factory):
    """A finished 2-step W4/S4 run (the zoo recipe, one layer) to resume from."""
    out = tmp_path_factory.mktemp("bad_inputs_run") / "run"
    assert main(["train", "--out", str(out), "--steps", "2", "--batch-size", "4", "--n-layers", "1"]) == 0
    return out


# ----------------------------------------------------------- broken checkpoints
def _truncate_weights(d: Path):
    blob = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(blob[: len(blob) // 2])


def _flip_byte(d: Path):
    blob = bytearray((d / "model.safetensors").read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (d / "model.safetensors").write_bytes(bytes(blob))


def _truncate_config(d: Path):
    text = (d / "config.json").read_text()
    (d / "config.json").write_text(text[: len(text) // 2])


def _drop_weights_bytes(d: Path):
    config = json.loads((d / "config.json").read_text())
    del config["weights_bytes"]
    (d / "config.json").write_text(json.dumps(config))


def _wrong_shapes(d: Path):
    config = json.loads((d / "config.json").read_text())
    config["model"]["d_mlp"] = 96  # the weights were saved with d_mlp = 64
    del config["config_sha256"]  # as a hand-written config (or one from before the hash) has: shapes are checked
    (d / "config.json").write_text(json.dumps(config))


def _missing_weights(d: Path):
    (d / "model.safetensors").unlink()


BREAK = {"truncated_weights": _truncate_weights, "flipped_byte": _flip_byte, "truncated_config": _truncate_config,
         "no_weights_bytes": _drop_weights_bytes, "wrong_shapes": _wrong_shapes,
         "missing_weights": _missing_weights,
         # Model-dependent errors come from config.json, before the weights load: with weights that
         # cannot load, the message must still name the bad layer / stride / shift.
         "layer_checked_before_loading": _truncate_weights, "stride_checked_before_loading": _truncate_weights,
         "shift_checked_before_loading": _truncate_weights,
         # the same for a Hugging Face DeepSeek-V4 checkpoint (dsv4-tiny with truncated weights)
         "hf_layer_checked_before_loading": _truncate_weights, "hf_shift_checked_before_loading": _truncate_weights}


# ------------------------------------------------------------------ CLI table
# (id, argv, substrings the one-line message must contain). Placeholders: {ckpt} a good tiny
# checkpoint (R = 8), {broken} a broken copy (the id names how), {file} an existing file,
# {out} a fresh path that must not exist afterwards, {run} a finished 2-step training run.
CLI_CASES = [
    ("unknown model", ["profile", "no-such-model", "--out", "{out}"], ["'no-such-model'"]),
    ("recipe-only zoo name", ["profile", "w8s8", "--out", "{out}"], ["'w8s8'", "recipe without a shipped"]),
    ("directory without config", ["profile", "{ckpt}/..", "--out", "{out}"], ["is not a checkpoint"]),
    ("device banana", ["profile", "{ckpt}", "--device", "banana", "--out", "{out}"], ["'banana'"]),
    ("device cuda without CUDA", ["profile", "{ckpt}", "--device", "cuda", "--out", "{out}"], ["'cuda'"]),
    ("device cuda:7", ["gates", "{ckpt}", "--device", "cuda:7", "--out", "{out}"], ["'cuda:7'"]),
    ("out is a file", ["profile", "{ckpt}", "--out", "{file}"], ["{file}", "existing file"]),
    ("out below a file", ["ablate", "{ckpt}", "--out", "{file}/sub"], ["{file}", "is a file"]),
    ("n-per-residue 0", ["profile", "{ckpt}", "--n-per-residue", "0", "--out", "{out}"], ["0 must be >= 1"]),
    ("n-per-residue 1e9 text", ["profile", "{ckpt}", "--n-per-residue", "1e9", "--out", "{out}"], ["'1e9'"]),
    ("n-per-residue huge", ["profile", "{ckpt}", "--n-per-residue", "1000000000", "--out", "{out}"],
     ["n_per_residue=1000000000", "500,000"]),
    ("n-per-residue unmatchable", ["profile", "{ckpt}", "--n-per-residue", "22", "--out", "{out}"],
     ["n_per_residue=22", "23"]),
    ("ablate n-per-residue unmatchable", ["ablate", "{ckpt}", "--n-per-residue", "17", "--out", "{out}"],
     ["n_per_residue=17"]),
    ("gates n-per-residue huge", ["gates", "{ckpt}", "--n-per-residue", "99999999", "--out", "{out}"],
     ["n_per_residue=99999999"]),
    ("stride not dividing R", ["profile", "{ckpt}", "--stride", "3", "--out", "{out}"], ["stride=3", "R=8"]),
    ("negative seed", ["profile", "{ckpt}", "--seed", "-1", "--out", "{out}"], ["-1 must be in 0..2**64 - 1"]),
    ("padding choice", ["profile", "{ckpt}", "--padding", "middle", "--out", "{out}"], ["'middle'"]),
    ("layer out of range", ["ablate", "{ckpt}", "--layer", "7", "--out", "{out}"], ["layer=7", "(0..1)"]),
    ("negative layer", ["ablate", "{ckpt}", "--layer", "-1", "--out", "{out}"], ["layer=-1"]),
    ("repeated layer", ["ablate", "{ckpt}", "--layer", "1", "1", "--out", "{out}"], ["[1, 1]", "repeats"]),
    ("n-calibration 1", ["ablate", "{ckpt}", "--n-calibration", "1", "--n-per-residue", "23", "--out", "{out}"],
     ["n_calibration=1", "R=8"]),
    ("scope choice", ["ablate", "{ckpt}", "--scope", "head", "--out", "{out}"], ["'head'"]),
    ("method choice", ["ablate", "{ckpt}", "--method", "slow", "--out", "{out}"], ["'slow'"]),
    ("cycle shift 0", ["cycle", "{ckpt}", "--shifts", "0", "--n-per-residue", "23", "--out", "{out}"],
     ["shift=0"]),
    ("cycle shift = S", ["cycle", "{ckpt}", "--shifts", "4", "--n-per-residue", "23", "--out", "{out}"],
     ["shift=4", "S=4"]),
    ("cycle shift = -2S", ["cycle", "{ckpt}", "--shifts", "1", "-8", "--n-per-residue", "23", "--out", "{out}"],
     ["shift=-8"]),
    ("cycle branch choice", ["cycle", "{ckpt}", "--branch", "q", "--out", "{out}"], ["'q'"]),
    ("cycle layer out of range", ["cycle", "{ckpt}", "--layer", "2", "--out", "{out}"], ["layer=2"]),
    ("truncated weights", ["profile", "{broken}", "--out", "{out}"], ["model.safetensors", "truncated"]),
    ("flipped byte", ["profile", "{broken}", "--out", "{out}"], ["model.safetensors", "SHA-256"]),
    ("truncated config", ["profile", "{broken}", "--out", "{out}"], ["config.json", "not valid JSON"]),
    ("no weights_bytes", ["profile", "{broken}", "--out", "{out}"], ["config.json", "weights_bytes"]),
    ("wrong shapes", ["profile", "{broken}", "--out", "{out}"], ["model.safetensors", "does not fit"]),
    ("missing weights", ["gates", "{broken}", "--out", "{out}"], ["model.safetensors", "does not exist"]),
    ("demo unknown model", ["demo", "--model", "nosuch", "--out", "{out}"], ["'nosuch'"]),
    ("demo recipe-only model", ["demo", "--model", "w8s8-vector", "--out", "{out}"], ["'w8s8-vector'"]),
    ("demo unknown twin", ["demo", "--twin", "nosuch-twin", "--out", "{out}"], ["'nosuch-twin'"]),
    ("demo out is a file", ["demo", "--out", "{file}"], ["{file}"]),
    ("demo unknown DeepSeek-V4", ["demo", "--deepseek-v4", "nosuch-dsv4", "--out", "{out}"], ["'nosuch-dsv4'"]),
    ("demo unknown remedy", ["demo", "--remedy", "nosuch-remedy", "--out", "{out}"], ["'nosuch-remedy'", "--remedy"]),
    ("demo remedy that is not staggered", ["demo", "--remedy", "w4s4", "--out", "{out}"], ["'w4s4'", "w4s4-staggered"]),
    ("report unknown twin", ["report", "{ckpt}", "--twin", "nosuch", "--out", "{out}"], ["'nosuch'"]),
    ("train stride 5", ["train", "--stride", "5", "--window", "5", "--steps", "1", "--out", "{out}"],
     ["--stride 5", "R=24"]),
    ("train lr 0", ["train", "--lr", "0", "--out", "{out}"], ["0 must be a finite number > 0"]),
    ("train lr nan", ["train", "--lr", "nan", "--out", "{out}"], ["nan must be a finite number > 0"]),
    ("train unknown recipe", ["train", "--zoo-recipe", "w9s9", "--out", "{out}"], ["'w9s9'"]),
    ("train device banana", ["train", "--device", "banana", "--out", "{out}"], ["'banana'"]),
    ("train over an existing run", ["train", "--steps", "2", "--out", "{run}"], ["{run}", "--resume"]),
    ("resume with a changed window", ["train", "--resume", "--window", "8", "--stride", "8", "--steps", "2",
                                      "--batch-size", "4", "--n-layers", "1", "--out", "{run}"],
     ["stride: 4 -> 8", "window: 4 -> 8"]),
    ("resume with fewer steps", ["train", "--resume", "--steps", "1", "--batch-size", "4", "--n-layers", "1",
                                 "--out", "{run}"], ["steps: 2 -> 1"]),
    ("resume with another lr", ["train", "--resume", "--steps", "2", "--batch-size", "4", "--n-layers", "1",
                                "--lr", "0.01", "--out", "{run}"], ["lr: 0.003 -> 0.01"]),
    ("zoo build unknown", ["zoo", "build", "nonexistent", "--out-dir", "{out}"], ["'nonexistent'"]),
    ("profile stride other than the model's", ["profile", "{ckpt}", "--stride", "2", "--out", "{out}"],
     ["--stride 2", "own stride S=4"]),
    ("layer checked before loading", ["ablate", "{broken}", "--layer", "7", "--out", "{out}"], ["layer=7", "(0..1)"]),
    ("stride checked before loading", ["profile", "{broken}", "--stride", "2", "--out", "{out}"], ["--stride 2"]),
    ("shift checked before loading", ["cycle", "{broken}", "--shifts", "8", "--out", "{out}"], ["shift=8", "S=4"]),
    ("hf layer checked before loading", ["ablate", "{broken}", "--layer", "7", "--out", "{out}"],
     ["layer=7", "3-layer model (0..2)"]),
    ("hf shift checked before loading", ["cycle", "{broken}", "--shifts", "8", "--out", "{out}"], ["shift=8", "S=4"]),
    ("train resume with nothing to resume", ["train", "--resume", "--steps", "2", "--out", "{out}"],
     ["--resume", "{out}", "no run to resume"]),
    ("train resume in an empty folder", ["train", "--resume", "--steps", "2", "--out", "{empty}"],
     ["{empty}", "no run to resume"]),
    ("demo model is its own twin", ["demo", "--model", "full", "--out", "{out}"], ["--twin full", "own twin"]),
    ("report twin is the model", ["report", "{ckpt}", "--twin", "{ckpt}", "--out", "{out}"], ["own twin"]),
    ("demo into a non-empty folder", ["demo", "--out", "{full}"], ["{full}", "not empty", "keep.txt"]),
    ("report into a non-empty folder", ["report", "{ckpt}", "--out", "{full}"], ["{full}", "not empty"]),
    ("shifts comma list with a non-integer", ["cycle", "{ckpt}", "--shifts", "1,x", "--out", "{out}"],
     ["'x'", "spaces or commas"]),
    ("layers comma list with a non-integer", ["ablate", "{ckpt}", "--layer", "0,one", "--out", "{out}"],
     ["'one'", "spaces or commas"]),
    ("zoo name in the wrong case", ["profile", "W4S4", "--out", "{out}"], ["'W4S4'", "did you mean 'w4s4'"]),
    ("unknown command", ["frobnicate"], ["'frobnicate'"]),
]


def _snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case_id, argv, expected", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_bad_input(case_id, argv, expected, checkpoint, tmp_path, capsys, request):
    if case_id == "device cuda without CUDA" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    places = {"{ckpt}": str(checkpoint), "{out}": str(tmp_path / "out"), "{file}": str(tmp_path / "a_file.txt"),
              "{empty}": str(tmp_path / "empty"), "{full}": str(tmp_path / "full")}
    (tmp_path / "a_file.txt").write_text("keep me")
    (tmp_path / "empty").mkdir()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("the user's file")
    if "{broken}" in " ".join(argv):
        broken = tmp_path / "broken"
        if case_id.startswith("hf "):
            import phaseinterp as pi

            shutil.copytree(pi.zoo.CHECKPOINT_DIR / "dsv4-tiny", broken)
        else:
            shutil.copytree(checkpoint, broken)
        BREAK[case_id.replace(" ", "_").replace("-", "_")](broken)
        places["{broken}"] = str(broken)
    run_before = None
    if "{run}" in " ".join(argv):
        run = request.getfixturevalue("train_run")
        places["{run}"] = str(run)
        run_before = _snapshot(run)
    argv = [_fill(a, places) for a in argv]
    before = _snapshot(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("phaseinterp: error:"), err
    for text in expected:
        assert _fill(text, places) in err, err
    assert "strict=False" not in err  # no flag the CLI lacks
    assert not (tmp_path / "out").exists(), "a failed command left an output folder"
    assert _snapshot(tmp_path) == before, "a failed command changed files"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["a_file.txt", "empty", "full"]
                                                                + (["broken"] if "{broken}" in places else [])), \
        "a failed command left a folder behind"
    if run_before is not None:
        assert _snapshot(Path(places["{run}"])) == run_before, "a refused resume changed the run"


def _fill(text: str, places: dict[str, str]) -> str:
    for key, value in places.items():
        text = text.replace(key, value)
    return text


# ------------------------------------------------------------------ API table
def _api_cases():
    """(id, call(model, tmp_path), exception type, substrings of the message)."""
    from phaseinterp import ablate, shift_gates, gate_cycling_profile, gate_profile, phase_profile, shifted_copy
    from phaseinterp.train import train

    batch = TASK.generate(23, seed=0)
    big = KeyValueRetrieval()  # R = 24
    return [
        ("ablate layer=[]", lambda m, t: ablate(m, layer=[], prompts=batch, progress=False), ValueError,
         ["layer=[]", "empty"]),
        ("ablate layer=1.0", lambda m, t: _unchecked(ablate)(m, layer=1.0, prompts=batch, progress=False), ValueError,
         ["layer=1.0"]),
        ("ablate layer=[1, 1]", lambda m, t: ablate(m, layer=[1, 1], prompts=batch, progress=False), ValueError,
         ["[1, 1]", "repeats"]),
        ("ablate layer='1'", lambda m, t: _unchecked(ablate)(m, layer="1", prompts=batch, progress=False), ValueError,
         ["layer='1'"]),
        ("ablate n_calibration=1", lambda m, t: ablate(m, n_calibration=1, prompts=batch, progress=False),
         ValueError, ["n_calibration=1"]),
        ("ablate n_per_residue huge", lambda m, t: ablate(m, n_per_residue=10**9, progress=False), ValueError,
         ["n_per_residue=1000000000"]),
        ("ablate scope", lambda m, t: ablate(m, scope="head", prompts=batch, progress=False), ValueError,
         ["scope='head'"]),
        ("ablate device banana", lambda m, t: ablate(m, device="banana", prompts=batch, progress=False), ValueError,
         ["'banana'"]),
        ("gate_cycling shifts=[0]", lambda m, t: gate_cycling_profile(m, shifts=[0], prompts=batch, progress=False),
         ValueError, ["shift=0"]),
        ("gate_cycling shifts=[4]", lambda m, t: gate_cycling_profile(m, shifts=[4], prompts=batch, progress=False),
         ValueError, ["shift=4", "S=4"]),
        ("gate_cycling shifts=[]", lambda m, t: gate_cycling_profile(m, shifts=[], prompts=batch, progress=False),
         ValueError, ["shifts=[]"]),
        ("gate_cycling shifts=[1.5]", lambda m, t: _unchecked(gate_cycling_profile)(m, shifts=[1.5], prompts=batch,
                                                                                   progress=False),
         ValueError, ["shift=1.5"]),
        ("shifted_copy shift='1'", lambda m, t: _unchecked(shifted_copy)(m, "1"), ValueError, ["shift='1'"]),
        ("build_report deepseek_v4=123", lambda m, t: _build_report(m, t / "rep", deepseek_v4=123), ValueError,
         ["deepseek_v4=int"]),
        ("build_report remedy='w4s4'", lambda m, t: _build_report(m, t / "rep", remedy="w4s4"), ValueError,
         ["'w4s4'", "w4s4-staggered"]),
        ("build_report deepseek_v4='nosuch'", lambda m, t: _build_report(m, t / "rep", deepseek_v4="nosuch"),
         ValueError, ["deepseek_v4='nosuch'"]),
        ("shift_gates layers=[5]", lambda m, t: shift_gates(m, 1, layers=[5]).__enter__(), ValueError, ["layer=5"]),
        ("build_report twin=model", lambda m, t: _build_report(m, t / "rep", twin=m), ValueError, ["own twin"]),
        ("build_report twin=same checkpoint", lambda m, t: _build_report(_saved(m, t), t / "rep", twin=_saved(m, t)),
         ValueError, ["own twin"]),
        ("build_report into a non-empty folder", lambda m, t: _build_report_into_nonempty(m, t), ValueError,
         ["not empty", "notes.txt"]),
        ("gate_profile n_per_residue=0", lambda m, t: gate_profile(m, n_per_residue=0), ValueError,
         ["n_per_residue=0"]),
        ("phase_profile task='x'", lambda m, t: phase_profile(m, "x", progress=False), ValueError, ["'x'"]),
        ("phase_profile n_per_residue huge", lambda m, t: phase_profile(m, TASK, n_per_residue=10**9, progress=False),
         ValueError, ["n_per_residue=1000000000"]),
        ("phase_profile n_per_residue=22", lambda m, t: phase_profile(m, TASK, n_per_residue=22, progress=False), ValueError,
         ["n_per_residue=22"]),
        ("phase_profile device banana", lambda m, t: phase_profile(m, batch, device="banana", progress=False),
         ValueError, ["'banana'"]),
        ("phase_profile stride=3", lambda m, t: phase_profile(m, batch, stride=3, progress=False), ValueError,
         ["stride=3"]),
        ("phase_profile batch_size=0", lambda m, t: phase_profile(m, batch, batch_size=0, progress=False),
         ValueError, ["batch_size=0"]),
        ("empty batch [0, T]", lambda m, t: m(torch.zeros(0, 16, dtype=torch.long)), ValueError, ["[0, 16]"]),
        ("save_pretrained to a file", lambda m, t: m.save_pretrained(t / "a_file.txt"), ValueError,
         ["a_file.txt"]),
        ("from_pretrained missing dir", lambda m, t: CompressedTransformer.from_pretrained(t / "nope"),
         FileNotFoundError, ["nope", "does not exist"]),
        ("from_pretrained device banana", lambda m, t: CompressedTransformer.from_pretrained(
            _saved(m, t), device="banana"), ValueError, ["'banana'"]),
        ("result save to a file", lambda m, t: _profile(m).save(t / "a_file.txt"), ValueError, ["a_file.txt"]),
        ("result load of another kind", lambda m, t: _load_as_other_kind(m, t), ValueError,
         ["AblationResult", "kind='PhaseProfile'"]),
        ("result load of a corrupt file", lambda m, t: _load_corrupt(m, t), ValueError,
         ["arrays.npz", "changed after it was saved"]),
        ("train stride 5 for R=24", lambda m, t: train(CFG.replace(window=5, stride=5, d_vocab=big.vocab.size,
                                                                  n_ctx=big.seq_len), big, steps=1, progress=False),
         ValueError, ["stride=5", "R=24"]),
    ]


def _unchecked(fn):
    """``fn`` without the test suite's runtime type checker (conftest's jaxtyping hook), which
    would reject a wrongly typed argument before the function's own check: users, who have no
    hook, get the function's ValueError, and that is what these rows test."""
    spec_type = None
    while hasattr(fn, "__applies_only__") or hasattr(fn, "__spec_type__"):
        spec_type = getattr(fn, "__spec_type__", spec_type)
        fn = fn.__wrapped__  # errors' shims and `experiment`'s spec maker: the checked function is below
    fn = getattr(fn, "__wrapped__", fn)
    return experiment(spec_type)(fn) if spec_type is not None else fn  # the spec made as a user's call makes it


def _saved(model, tmp: Path) -> Path:
    return model.save_pretrained(tmp / "saved", overwrite=True)  # called twice for the twin row


def _profile(model):
    from phaseinterp import phase_profile

    return phase_profile(model, TASK.generate(23, seed=0), progress=False, n_permutations=19)


def _load_as_other_kind(model, tmp: Path):
    from phaseinterp import AblationResult

    return AblationResult.load(_profile(model).save(tmp / "p"))


def _build_report(model, out: Path, **kwargs):
    from phaseinterp.report import build_report

    try:
        return build_report(model, out, progress=False, log=lambda *_: None, **kwargs)
    finally:
        assert not out.exists(), "a bad deepseek_v4 must be refused before the report folder is written"


def _build_report_into_nonempty(model, tmp: Path):
    from phaseinterp.report import build_report

    (tmp / "mine").mkdir()
    (tmp / "mine" / "notes.txt").write_text("not a report")
    try:
        return build_report(model, tmp / "mine", progress=False, log=lambda *_: None)
    finally:
        assert sorted(p.name for p in (tmp / "mine").iterdir()) == ["notes.txt"]
        assert not [p for p in tmp.iterdir() if p.name.startswith(".")], "a staging folder was left behind"


def _load_corrupt(model, tmp: Path):
    from phaseinterp import PhaseProfile

    path = _profile(model).save(tmp / "p")
    (path / "arrays.npz").write_bytes(b"PK\x03\x04 broken")
    return PhaseProfile.load(path)


API_IDS = [c[0] for c in _api_cases()]


@pytest.mark.parametrize("case_id", API_IDS)
def test_api_bad_input(case_id, model, tmp_path):
    (_, call, error, expected), = [c for c in _api_cases() if c[0] == case_id]
    (tmp_path / "a_file.txt").write_text("keep me")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(error) as info:
        call(model, tmp_path)
    message = str(info.value)
    for text in expected:
        assert text in message, message
    assert (tmp_path / "a_file.txt").read_text() == "keep me"
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items()), "the model was changed"
    assert not [p for p in tmp_path.rglob("*.tmp")], "a temporary file was left behind"


def test_there_are_at_least_40_distinct_bad_inputs():
    assert len(CLI_CASES) + len(API_IDS) >= 40
    assert len({c[0] for c in CLI_CASES}) == len(CLI_CASES) and len(set(API_IDS)) == len(API_IDS)


def test_json_output_is_strict(model, tmp_path):
    """Result files and summaries never contain the non-JSON tokens NaN / Infinity."""
    from phaseinterp.results import dumps

    profile = _profile(model)
    path = profile.save(tmp_path / "p")
    json.loads((path / "meta.json").read_text(), parse_constant=_no_constants)
    text = dumps({"a": float("nan"), "b": [np.float64("inf"), 1.0], "c": np.int64(3)})
    assert json.loads(text, parse_constant=_no_constants) == {"a": None, "b": [None, 1.0], "c": 3}


def _no_constants(name):
    raise AssertionError(f"non-strict JSON constant {name}")


def test_nan_field_round_trips(model, tmp_path):
    """A NaN scalar field (e.g. a period p-value of an untestable profile) survives save/load as NaN."""
    from dataclasses import replace

    from phaseinterp import PhaseProfile

    profile = replace(_profile(model), period_p_value=float("nan"))
    loaded = PhaseProfile.load(profile.save(tmp_path / "p"))
    assert math.isnan(loaded.period_p_value) and loaded == profile


def test_an_internal_error_keeps_its_traceback(monkeypatch):
    """Only bad user input (UserInputError), missing files and broken checkpoints exit 2 in one line;
    a ValueError from a bug propagates (exit code 1 with its traceback)."""
    import subprocess
    import sys

    import phaseinterp.zoo as zoo
    from phaseinterp.errors import UserInputError

    def broken():
        raise ValueError("an internal bug, not the user's input")

    monkeypatch.setattr(zoo, "catalog", broken)
    with pytest.raises(ValueError, match="an internal bug"):
        main(["zoo", "list"])

    def refused():
        raise UserInputError("n=3 is out of range (1..2)")

    monkeypatch.setattr(zoo, "catalog", refused)
    assert main(["zoo", "list"]) == 2
    code = ("import sys, phaseinterp.zoo as zoo, phaseinterp.cli as cli\n"
            "def broken():\n    raise ValueError('an internal bug')\n"
            "zoo.catalog = broken\nsys.exit(cli.main(['zoo', 'list']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback (most recent call last)" in proc.stderr and "ValueError: an internal bug" in proc.stderr


# ----------------------------------------------------- the write rule (issue 37)
# Every function that writes a user's folder, by "module:qualname", and how to write `target`
# with it (`overwrite` passed through where the writer takes it). `test_every_writer_is_listed`
# finds the writers in the source (a public function with an out/out_dir/directory/path argument
# whose body writes), so a new writer that is neither listed here nor in WRITERS_EXEMPT fails.
def _write_result(model, target, overwrite=False):
    return _profile(model).save(target, overwrite=overwrite)


def _write_checkpoint(model, target, overwrite=False):
    return model.save_pretrained(target, overwrite=overwrite)


def _write_hf_checkpoint(model, target, overwrite=False):
    return _dsv4().save_pretrained(target, overwrite=overwrite)


def _write_export(model, target, overwrite=False):
    from phaseinterp.models.hf.export import export_release

    return export_release(_dsv4(), target, overwrite=overwrite)


def _write_report(model, target, overwrite=False):
    from phaseinterp.report import build_report

    return build_report(model, target, overwrite=overwrite, progress=False, log=lambda *_: None)


def _write_shards(model, target, overwrite=False):
    from phaseinterp.parallel import sharded_profile

    return sharded_profile(model, TASK, n_per_residue=23, out_dir=target, progress=False)


def _write_training_run(model, target, overwrite=False):
    from phaseinterp.train import train

    return train(CFG.replace(n_layers=1), TASK, steps=1, batch_size=2, out_dir=target, resume=overwrite,
                 progress=False)


_TEXT = []


def _text_corpus() -> tuple[Path, Path]:
    """A small English corpus (pydoc's topics) and a 1024-token BPE trained on it, made once."""
    if not _TEXT:
        import tempfile

        from pydoc_data.topics import topics

        from phaseinterp.train.tokenizer import train_tokenizer

        root = Path(tempfile.mkdtemp(prefix="phaseinterp-text-"))
        data = root / "topics.jsonl"
        data.write_text("".join(json.dumps({"text": p}) + "\n" for k in sorted(topics)
                                for p in topics[k].split("\n\n") if len(p) > 80))
        _TEXT.append((data, train_tokenizer(data, 1024, root / "tokenizer", progress=False)))
    return _TEXT[0]


def _write_pretraining_run(model, target, overwrite=False):
    from phaseinterp.config import preset
    from phaseinterp.train.pretrain import PretrainConfig, prepare

    data, tokenizer = _text_corpus()
    return prepare(preset("tiny", d_vocab=1024), data, tokenizer, PretrainConfig(seq_len=64), target,
                   resume=overwrite, progress=False)


def _write_tokenizer(model, target, overwrite=False):
    from phaseinterp.train.tokenizer import train_tokenizer

    return train_tokenizer(_text_corpus()[0], 300, target, overwrite=overwrite, progress=False)


def _write_lm_eval_task(model, target, overwrite=False):
    from phaseinterp.engines.lm_eval import write_lm_eval_task

    return write_lm_eval_task(model, target, n_per_residue=23, overwrite=overwrite)


@functools.cache
def _two_paper_figures() -> dict:
    from phaseinterp.report.paper import paper_figures

    return dict(list(paper_figures().items())[:2])


def _write_paper(model, target, overwrite=False):
    """The paper writer's path rules, on two of its 43 figures (built once: building all takes 13 s a call)."""
    from unittest import mock

    from phaseinterp.report import paper

    figures = _two_paper_figures()  # built before the patch, from the real paper_figures
    with mock.patch.object(paper, "paper_figures", lambda: figures):
        return paper.write_paper_figures(target, static=False, overwrite=overwrite)


_DSV4 = []


def _dsv4():
    if not _DSV4:
        import phaseinterp as pi

        _DSV4.append(pi.zoo.load("dsv4-tiny"))
    return _DSV4[0]


# writer -> (how to write, the kind it writes, whether a second write is cheap enough to run here)
WRITERS = {
    "phaseinterp.results:Result.save": (_write_result, "PhaseProfile result", True),
    "phaseinterp.models.transformer:CompressedTransformer.save_pretrained": (_write_checkpoint,
                                                                             "phaseinterp checkpoint", True),
    "phaseinterp.models.hf.deepseek_v4:HookedDeepseekV4.save_pretrained": (_write_hf_checkpoint,
                                                                           "Hugging Face checkpoint", True),
    "phaseinterp.models.hf.export:export_release": (_write_export, "Hugging Face checkpoint", True),
    "phaseinterp.report.build:build_report": (_write_report, "report", False),  # twice: test_report_page (slow)
    "phaseinterp.parallel.runs:_run": (_write_shards, "shard folder", False),  # a rerun resumes: test_distributed
    "phaseinterp.train.compressed:train": (_write_training_run, "training run", True),
    "phaseinterp.train.pretrain:prepare": (_write_pretraining_run, "pretraining run", True),
    "phaseinterp.train.tokenizer:train_tokenizer": (_write_tokenizer, "tokenizer", True),
    "phaseinterp.engines.lm_eval:write_lm_eval_task": (_write_lm_eval_task, "lm-eval task", True),
    "phaseinterp.report.paper:write_paper_figures": (_write_paper, "report", True),
}
# Writers outside the rule, each with the reason. Internal helpers write only into a folder a
# listed writer has just made (a report's staging folder, a result's new folder).
WRITERS_EXEMPT = {
    "phaseinterp._files:atomic_write": "the primitive every writer uses for one file",
    "phaseinterp._files:atomic_write_text": "the primitive every writer uses for one file",
    "phaseinterp._files:check_write_target": "the rule itself",
    "phaseinterp.results:Result.load": "a reader",
    "phaseinterp.parallel.shards:write_shard": "one shard file inside a folder `_run` checked",
    "phaseinterp.report.section:write_profile_csvs": "CSV files inside a report's staging folder",
    "phaseinterp.report.sections.deepseek_v4:deepseek_v4_section": "CSV files inside a report's staging folder",
    "phaseinterp.experiments.remedy:compare_remedy": "a resumable sweep: each run folder goes through train(resume=True)",
    "phaseinterp.train.deepseek_v4:train_tiny": "the zoo rebuild's own run folder (runs/zoo/NAME); its final model "
                                                 "goes through HookedDeepseekV4.save_pretrained",
    "phaseinterp.engines.answers:_open_journal": "an engine profile's resumable journal: it only grows, one whole "
                                                 "batch file at a time (test_engine_journal_*)",
    "phaseinterp.plot.export:save": "single figure files: FILE_WRITERS",
    "phaseinterp.report.check:first_screen_png": "one PNG file (README's picture): FILE_WRITERS",
    "phaseinterp.engines.answers:_read_batch": "drops (unlinks) a torn batch file of the journal, to ask it again",
    "phaseinterp.engines.answers:_drop_torn_writes": "removes the journal's own hidden temporaries of a stopped write",
    "phaseinterp._files:check_file_target": "the rule for one file",
    "phaseinterp._files:write_file_atomically": "the one-file writer the walked writers use",
    "phaseinterp._files:move_file_into_place": "write_file_atomically's last step",
    "phaseinterp._files:temporary_file_beside": "write_file_atomically's first step",
    "phaseinterp.results:Result._write": "fills the new folder Result.save's write_dir_atomically made",
    "phaseinterp.report.sections.mechanisms:_unit_cycling": "CSV files inside a report's staging folder",
    "phaseinterp.engines.answers:_write_batch": "a batch file inside an engine profile's journal",
    "phaseinterp.train.pretrain:_write_tables": "curves.csv / probe.csv inside the run folder prepare checked",
    "phaseinterp.train.pretrain:_write_model": "config.json + model.safetensors inside the run folder prepare checked",
    "phaseinterp._files:through_links": "a path helper (follows a link at the end of a path)",
    "phaseinterp.paper.build:build": "the maintainer's package-data builder (python -m phaseinterp.paper.build): its "
                                     "own rule, check_build_target (a new, empty or previous build's folder), then "
                                     "write_dir_atomically",
}
_PATH_ARGS = {"directory", "out", "out_dir", "output_dir", "path", "png", "dest", "target"}
_WRITES = ("atomic_write", "save_pretrained(", ".mkdir(", "write_text(", "write_bytes(", "to_csv(", "os.replace",
           "write_dir_atomically", ".save(", "move_into_place(", "_replace_dir(")


def _writers_in_source() -> set[str]:
    import ast

    import phaseinterp

    root = Path(phaseinterp.__file__).parent
    found = set()
    for file in sorted(root.rglob("*.py")):
        if "cli" in file.relative_to(root).parts:  # the CLI's writers are the API's (test_every_out_verb_...)
            continue
        text = file.read_text()
        module = ".".join(("phaseinterp", *file.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        tree = ast.parse(text)
        for parent in [tree, *[n for n in tree.body if isinstance(n, ast.ClassDef)]]:
            for node in parent.body:
                if not isinstance(node, ast.FunctionDef):
                    continue
                args = {a.arg for a in node.args.args + node.args.kwonlyargs}
                source = ast.get_source_segment(text, node) or ""
                if args & _PATH_ARGS and any(w in source for w in _WRITES):
                    name = node.name if parent is tree else f"{parent.name}.{node.name}"
                    found.add(f"{module}:{name}")
    return found


def test_every_writer_is_listed_and_uses_the_rule():
    import importlib
    import inspect

    found = _writers_in_source()
    assert found - set(WRITERS) - set(WRITERS_EXEMPT) == set(), "a writer outside the write rule (list it in WRITERS)"
    assert set(WRITERS) - found == set(), "WRITERS names a function the source no longer has"
    for name in WRITERS:
        module, qualname = name.split(":")
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        source = inspect.getsource(obj)
        assert "check_write_target" in source or "check_report_dir" in source, f"{name} does not call the rule"
    from phaseinterp._files import check_write_target

    for name in WRITERS:  # the rule's docstring lists the writers that use it
        assert name.split(":")[1].split(".")[-1] in check_write_target.__doc__ or \
            name.split(":")[1] in check_write_target.__doc__, name


def _user_files(folder: Path) -> Path:
    folder.mkdir()
    (folder / "notes.txt").write_text("the user's notes")
    return folder


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_writer_never_replaces_what_it_did_not_write(writer, model, tmp_path):
    """A folder of the user's files, or of another saved kind, is refused in one line naming the
    argument and what it holds; nothing there changes and no temporary folder is left."""
    write, kind, _ = WRITERS[writer]
    from phaseinterp.errors import UserInputError

    mine = _user_files(tmp_path / "mine")
    other = tmp_path / "other"
    if kind == "phaseinterp checkpoint":
        _profile(model).save(other)
    else:
        model.save_pretrained(other)
    a_file = tmp_path / "a_file.txt"
    a_file.write_text("keep me")
    before = _snapshot(tmp_path)
    for target, expected in ((mine, "notes.txt"), (other, "holds a"), (a_file, "existing file")):
        with pytest.raises(UserInputError) as info:
            write(model, target)
        assert expected in str(info.value) and str(target) in str(info.value), str(info.value)
        with pytest.raises(UserInputError):
            write(model, target, overwrite=True)  # overwrite replaces only the same kind
    assert _snapshot(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file.txt", "mine", "other"]


@pytest.mark.parametrize("writer", sorted(w for w, (_, _, cheap) in WRITERS.items() if cheap))
def test_a_writer_replaces_its_own_kind_only_with_overwrite(writer, model, tmp_path):
    from phaseinterp._files import saved_kind
    from phaseinterp.errors import UserInputError

    write, kind, _ = WRITERS[writer]
    target = tmp_path / "t"
    write(model, target)
    assert saved_kind(target) == kind
    (target / "marker.txt").write_text("from the first write")
    with pytest.raises(UserInputError, match="already holds a"):
        write(model, target)
    assert (target / "marker.txt").is_file()
    if kind.endswith(" result"):  # a saved result is two files: the user's third is never taken with it
        with pytest.raises(UserInputError, match="and also marker.txt, which replacing it would delete"):
            write(model, target, overwrite=True)
        assert (target / "marker.txt").read_text() == "from the first write"
        (target / "marker.txt").unlink()
    write(model, target, overwrite=True)
    assert saved_kind(target) == kind
    if kind not in ("training run", "pretraining run"):  # a resumed run continues in its folder; the others are
        # replaced whole
        assert not (target / "marker.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"], "a staging folder was left behind"


@pytest.mark.parametrize("writer", [pytest.param(w, marks=pytest.mark.slow) if w.endswith("build_report") else w
                                    for w in sorted(WRITERS)])
def test_a_writer_writes_through_a_link_and_never_moves_it(writer, model, tmp_path):
    """--out naming a symbolic link to a folder: the folder it points to is written (and, for the writers
    whose second write is cheap, replaced with overwrite); the link stays a link to it, and nothing is
    left beside either. A report or a shard folder (costly, or resuming) is written once."""
    from phaseinterp._files import saved_kind

    write, kind, cheap = WRITERS[writer]
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real, target_is_directory=True)
    for options in ({}, {"overwrite": True}) if cheap else ({},):
        write(model, link, **options)
        assert link.is_symlink() and Path(os.readlink(link)) == real and saved_kind(real) == kind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"], "a staging folder or moved link was left"


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_writer_refuses_an_unwritable_place_before_any_work(writer, model, monkeypatch):
    """/proc accepts no new folder (even for root, whom os.access always answers yes): refused at once,
    naming the path, before the work (the work is patched to fail loudly if it is reached)."""
    from phaseinterp.errors import UserInputError

    write, _, _ = WRITERS[writer]
    target = Path("/proc") / "phaseinterp-cannot-write-here"
    if not Path("/proc").is_dir():
        pytest.skip("no /proc on this system")
    with pytest.raises(UserInputError, match="is not writable") as info:
        write(model, target)
    assert str(target) in str(info.value)


def test_every_out_verb_refuses_without_overwrite(model, checkpoint, tmp_path, capsys):
    """Every CLI verb with --overwrite refuses a folder that holds another saved kind or the user's files."""
    from phaseinterp.cli.args import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices
    # the verbs that write an --out folder (`screenshot` writes one file: FILE_WRITERS walks it)
    verbs = [v for v, p in sub.items() if any("--overwrite" in a.option_strings for a in p._actions)
             and any("--out" in a.option_strings for a in p._actions)]
    verbs += [f"zoo {z}" for z, p in sub["zoo"]._subparsers._group_actions[0].choices.items()
              if any("--overwrite" in a.option_strings for a in p._actions)]
    assert {"demo", "report", "profile", "ablate", "cycle", "gates", "conformance", "merge", "zoo export"} <= set(verbs)
    mine = _user_files(tmp_path / "mine")
    argv = {"demo": ["demo"], "report": ["report", str(checkpoint)], "profile": ["profile", str(checkpoint)],
            "ablate": ["ablate", str(checkpoint)], "cycle": ["cycle", str(checkpoint)], "gates": ["gates", str(checkpoint)],
            "conformance": ["conformance", str(checkpoint)], "merge": ["merge", str(tmp_path / "mine")],
            "zoo export": ["zoo", "export", "dsv4-tiny", "--layout", "deepseek"],
            "lm-eval-task": ["lm-eval-task", str(checkpoint)], "paper": ["paper", "--no-static"]}
    before = _snapshot(tmp_path)
    for verb in verbs:
        if verb == "merge":
            continue  # its kind is read from the shards' run header: refused at save (API rows above)
        for extra in ([], ["--overwrite"]):
            assert main(argv[verb] + ["--out", str(mine), *extra]) == 2, verb
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and "notes.txt" in err, (verb, err)
    assert _snapshot(tmp_path) == before


# ------------------------------------------------------ devices (issue 37)
# Every public function or method that takes a device / device_map, and a call with a bad one.
BAD_DEVICE, BAD_MAP = "cpu:1", {"model.layers.0": "cuda:7"}


def _as_model():
    from phaseinterp.report.models import as_model

    return as_model


def _device_calls():
    import phaseinterp as pi
    from phaseinterp.report.sections.deepseek_v4 import load_deepseek_v4
    from phaseinterp.theory.model import IdealizedInductionModel, equiangular_embeddings

    batch = TASK.generate(23, seed=0)
    return {
        "phaseinterp.interventions.ablation:ablate": lambda m, t: pi.ablate(m, device=BAD_DEVICE, prompts=batch),
        "phaseinterp.models.hf:load_hf": lambda m, t: pi.load_hf(pi.zoo.CHECKPOINT_DIR / "dsv4-tiny",
                                                                 device_map=BAD_MAP),
        "phaseinterp.models.transformer:CompressedTransformer.__init__": lambda m, t: CompressedTransformer(
            CFG, device=BAD_DEVICE),
        "phaseinterp.models.transformer:CompressedTransformer.from_pretrained": lambda m, t: (
            CompressedTransformer.from_pretrained(_saved(m, t), device=BAD_DEVICE)),
        "phaseinterp.parallel.runs:sharded_ablate": lambda m, t: pi.parallel.sharded_ablate(
            m, TASK, out_dir=t / "s", device=BAD_DEVICE),
        "phaseinterp.parallel.runs:sharded_gate_cycling_profile": lambda m, t: pi.parallel.sharded_gate_cycling_profile(
            m, TASK, [1], out_dir=t / "s", device=BAD_DEVICE),
        "phaseinterp.parallel.runs:sharded_profile": lambda m, t: pi.parallel.sharded_profile(
            m, TASK, n_per_residue=23, out_dir=t / "s", device=BAD_DEVICE),
        "phaseinterp.profile:phase_profile": lambda m, t: pi.phase_profile(m, batch, device=BAD_DEVICE),
        "phaseinterp.engines.profile:engine_profile": lambda m, t: pi.engine_profile(pi.engines.CacheEngine(m), batch, stride=4,
                                                                             device=BAD_DEVICE),
        # the options' __init__ (declared in _checks) is the spec's: the spec checks its device
        "phaseinterp._checks:ProfileOptions.__init__": lambda m, t: pi.ProfileSpec(device=BAD_DEVICE),
        "phaseinterp._checks:AblationOptions.__init__": lambda m, t: pi.AblationSpec(device=BAD_DEVICE),
        "phaseinterp.report.build:build_report": lambda m, t: pi.report.build_report(m, t / "r", device=BAD_DEVICE),
        "phaseinterp.report.models:as_model": lambda m, t: _as_model()("w4s4", BAD_DEVICE),
        "phaseinterp.models.loading:load": lambda m, t: pi.load("w4s4", device=BAD_DEVICE),
        "phaseinterp.report.sections.deepseek_v4:load_deepseek_v4": lambda m, t: load_deepseek_v4("dsv4-tiny",
                                                                                                   BAD_DEVICE),
        "phaseinterp.tasks.docstring:DocstringProbe.run": lambda m, t: _unchecked(type(_docstring_probe()).run)(
            _docstring_probe(), m, None, device=BAD_DEVICE),
        "phaseinterp.theory.model:IdealizedInductionModel.__init__": lambda m, t: IdealizedInductionModel(
            32, 4, 8, 2, device=BAD_DEVICE),
        "phaseinterp.theory.model:equiangular_embeddings": lambda m, t: equiangular_embeddings(8, 0.1, 0.0,
                                                                                             device=BAD_DEVICE),
        "phaseinterp.train.compressed:train": lambda m, t: pi.train.train(CFG, TASK, steps=1, device=BAD_DEVICE),
        "phaseinterp.zoo:build": lambda m, t: pi.zoo.build("w4s4", t / "z", device=BAD_DEVICE),
        "phaseinterp.zoo.deepseek_v4:load": lambda m, t: pi.zoo.deepseek_v4.load("dsv4-tiny", device=BAD_DEVICE),
        "phaseinterp.models.catalog:load": lambda m, t: pi.zoo.load("w4s4", device=BAD_DEVICE),  # zoo.load
        "phaseinterp.models.paths:CheckedHooks.add_caching_hooks": lambda m, t: m.add_caching_hooks(device=BAD_DEVICE),
    }


def _docstring_probe():
    from phaseinterp.tasks.docstring import DocstringProbe

    return DocstringProbe.__new__(DocstringProbe)  # the device is checked before the probe's prompts are built


# Parameters named device that are not a user's choice of device (checked, or internal plumbing).
DEVICE_EXEMPT = {
    "phaseinterp._checks:check_device": "the check itself", "phaseinterp._checks:check_device_map": "the check itself",
    "phaseinterp.config:CompressedConfig.__init__": "a record of where the model was built, set by the model",
    "phaseinterp.interventions._common:model_device": "resolves an already checked device",
    "phaseinterp.models.hf.config:DeepseekV4HookedConfig.__init__": "a record of the wrapped model's device",
    "phaseinterp.models.hf.offload:check_max_memory": "reads a device_map load_hf has checked",
    "phaseinterp.models.rope:rotary_tables": "internal: the model's own device",
    "phaseinterp.train.pretrain:autocast_for": "internal: the device of the model pretrain placed",
    "phaseinterp.report.section:ReportContext.__init__": "internal: build_report checked it",
}


def _device_functions() -> set[str]:
    import importlib
    import inspect
    import pkgutil

    import phaseinterp

    found = set()
    for info in pkgutil.walk_packages(phaseinterp.__path__, "phaseinterp."):
        if ".cli" in info.name or info.name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional extra that is not installed
            continue
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            members = [(name, obj)] if inspect.isfunction(obj) else []
            if inspect.isclass(obj):
                members = [(f"{name}.{m}", getattr(f, "__func__", f)) for m, f in vars(obj).items()
                           if (not m.startswith("_") or m == "__init__") and inspect.isfunction(getattr(f, "__func__", f))]
            for qualname, fn in members:
                try:
                    params = inspect.signature(fn).parameters
                except (TypeError, ValueError):
                    continue
                if {"device", "device_map"} & set(params):
                    found.add(f"{module.__name__}:{qualname}")
    return found


def test_every_device_argument_is_walked():
    assert _device_functions() - set(_device_calls()) - set(DEVICE_EXEMPT) == set(), \
        "a function takes a device but is not in _device_calls()"
    assert set(_device_calls()) - _device_functions() == set()


DEVICE_IDS = ["phaseinterp.interventions.ablation:ablate",
              "phaseinterp.models.hf:load_hf", "phaseinterp.models.transformer:CompressedTransformer.__init__",
              "phaseinterp.models.transformer:CompressedTransformer.from_pretrained",
              "phaseinterp.parallel.runs:sharded_ablate", "phaseinterp.parallel.runs:sharded_gate_cycling_profile",
              "phaseinterp.parallel.runs:sharded_profile", "phaseinterp.profile:phase_profile",
              "phaseinterp.engines.profile:engine_profile", "phaseinterp._checks:ProfileOptions.__init__",
              "phaseinterp._checks:AblationOptions.__init__",
              "phaseinterp.models.loading:load", "phaseinterp.report.models:as_model",
              "phaseinterp.report.build:build_report",
              "phaseinterp.report.sections.deepseek_v4:load_deepseek_v4", "phaseinterp.tasks.docstring:DocstringProbe.run",
              "phaseinterp.theory.model:IdealizedInductionModel.__init__", "phaseinterp.theory.model:equiangular_embeddings",
              "phaseinterp.train.compressed:train", "phaseinterp.zoo:build", "phaseinterp.zoo.deepseek_v4:load",
              "phaseinterp.models.catalog:load", "phaseinterp.models.paths:CheckedHooks.add_caching_hooks"]


@pytest.mark.parametrize("name", DEVICE_IDS)
def test_a_device_that_does_not_exist_is_one_error_before_any_work(name, model, tmp_path):
    from phaseinterp.errors import UserInputError

    assert set(DEVICE_IDS) == set(_device_calls())
    with pytest.raises(UserInputError) as info:
        _device_calls()[name](model, tmp_path)
    message = str(info.value)
    bad = "cuda:7" if name.endswith("load_hf") else BAD_DEVICE
    assert repr(bad) in message and "this machine has" in message, message
    assert ("device_map" if name.endswith("load_hf") else "device") in message, message
    assert [p.name for p in tmp_path.iterdir()] in ([], ["saved"]), "written before the device was checked"


def test_every_device_verb_refuses_a_device_that_does_not_exist(checkpoint, tmp_path, capsys):
    from phaseinterp.cli.args import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices
    verbs = {v: [v] for v, p in sub.items() if any("--device" in a.option_strings for a in p._actions)}
    verbs.update({f"zoo {z}": ["zoo", z] for z, p in sub["zoo"]._subparsers._group_actions[0].choices.items()
                  if any("--device" in a.option_strings for a in p._actions)})
    assert {"demo", "report", "profile", "ablate", "cycle", "gates", "conformance", "train", "zoo build"} <= set(verbs)
    model_arg = {"report", "profile", "ablate", "cycle", "gates", "conformance"}
    for verb, argv in verbs.items():
        argv = argv + ([str(checkpoint)] if verb in model_arg else ["w4s4"] if verb == "zoo build" else [])
        argv += ["--out", str(tmp_path / "out")] if verb not in ("zoo build",) else ["--out-dir", str(tmp_path / "out")]
        for bad in ("cpu:1", "cuda:7", "mps", "banana"):
            if bad == "cuda:7" and torch.cuda.device_count() > 7:
                continue
            assert main(argv + ["--device", bad]) == 2, (verb, bad)
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and f"device={bad!r}" in err and "this machine has" in err, (verb, err)
    assert not (tmp_path / "out").exists()


# ----------------------------------------------- single-file writers (issue 37)
# Every function that writes one file a user names, and how to write `target` with it; `fail` makes
# the write raise midway (after part of the file is written). Each goes through
# `_files.write_file_atomically` / `check_file_target`.
def _a_figure():
    import plotly.graph_objects as go

    return go.Figure(go.Scatter(x=[0, 1], y=[1, 0]))


def _fake_kaleido(monkeypatch, fail: bool):
    """Static export without kaleido or Chromium: each image is a few bytes, or half of one then an error."""
    import plotly.io as pio

    from phaseinterp.plot import export

    def write_images(figures, paths, format=None, scale=None, width=None, height=None,  # noqa: A002 - plotly's names
                     validate=True):  # plotly.io.write_images' signature (save_static passes width= and height=)
        for path in paths:
            Path(path).write_bytes(b"\x89PNG half" if fail else b"\x89PNG whole image")
            if fail:
                raise RuntimeError("the browser died midway")

    monkeypatch.setattr(export, "_check_static", lambda name: None)
    monkeypatch.setattr(pio, "write_images", write_images)
    monkeypatch.setattr(export, "_write_static",
                        lambda fig, target, kind, scale: write_images([fig], [target], format=kind, scale=scale))


def _write_figure_html(target, overwrite, monkeypatch, fail):
    import plotly.graph_objects as go

    from phaseinterp.plot import export

    if fail:
        def half(self, path, **kwargs):
            Path(path).write_text("<html><body>half a page")
            raise RuntimeError("plotly failed midway")

        monkeypatch.setattr(go.Figure, "write_html", half)
    return export.save(_a_figure(), target, overwrite=overwrite)


def _write_figure_png(target, overwrite, monkeypatch, fail):
    from phaseinterp.plot import export

    _fake_kaleido(monkeypatch, fail)
    return export.save(_a_figure(), target, overwrite=overwrite)


def _write_static_images(target, overwrite, monkeypatch, fail):
    from phaseinterp.plot import export

    _fake_kaleido(monkeypatch, fail)
    return export.save_static({target: _a_figure()}, overwrite=overwrite)


def _write_first_screen(target, overwrite, monkeypatch, fail):
    import phaseinterp._files as files
    from phaseinterp.report import check

    page = target.parent / "page" / "index.html"  # made by the test, before its snapshot

    def chromium(args, profile, timeout):
        shot = next(a.split("=", 1)[1] for a in args if a.startswith("--screenshot="))
        Path(shot).write_bytes(b"\x89PNG the first screen")

    monkeypatch.setattr(check, "_chromium", chromium)
    if fail:
        def fsync(fd):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(files.os, "fsync", fsync)
    return check.first_screen_png(page, target, overwrite=overwrite)


FILE_WRITERS = {  # writer -> (how to write, the file name it is given)
    "phaseinterp.plot.export:save (html)": (_write_figure_html, "figure.html"),
    "phaseinterp.plot.export:save (png)": (_write_figure_png, "figure.png"),
    "phaseinterp.plot.export:save_static": (_write_static_images, "figure.png"),
    "phaseinterp.report.check:first_screen_png": (_write_first_screen, "first.png"),
}


def test_every_file_writer_is_walked():
    """The single-file writers WRITERS_EXEMPT points here are walked below, and each uses the rule."""
    import importlib
    import inspect

    pointed = {name for name, why in WRITERS_EXEMPT.items() if "FILE_WRITERS" in why}
    walked = {name.split(" ")[0] for name in FILE_WRITERS}
    assert pointed <= walked, pointed - walked
    from phaseinterp._files import check_file_target

    for name in walked:
        module, qualname = name.split(":")
        source = inspect.getsource(getattr(importlib.import_module(module), qualname))
        assert "check_file_target" in source or "figure_targets" in source, f"{name} does not call the one-file rule"
        assert qualname in check_file_target.__doc__, f"check_file_target's docstring does not list {name}"


@pytest.mark.parametrize("writer", sorted(FILE_WRITERS))
def test_a_file_writer_refuses_an_existing_file_and_leaves_nothing_when_it_fails(writer, tmp_path, monkeypatch):
    from phaseinterp.errors import UserInputError

    write, file_name = FILE_WRITERS[writer]
    target = tmp_path / file_name
    target.write_text("the user's file")
    folder = tmp_path / ("folder" + Path(file_name).suffix)
    folder.mkdir()
    (tmp_path / "page").mkdir()
    (tmp_path / "page" / "index.html").write_text("<html><body>a report</body></html>")
    before = _snapshot(tmp_path)
    with pytest.raises(UserInputError, match="already exists") as info:
        write(target, False, monkeypatch, False)
    assert str(target) in str(info.value) and "overwrite" in str(info.value)
    with pytest.raises(UserInputError, match="is a folder"):
        write(folder, True, monkeypatch, False)
    assert _snapshot(tmp_path) == before, "a refused write changed a file"

    with monkeypatch.context() as patch:  # the write raises midway: the user's file stays, no partial file
        with pytest.raises(Exception) as info:
            write(target, True, patch, True)
        assert not isinstance(info.value, UserInputError), info.value
    assert _snapshot(tmp_path) == before, "a failed write left a partial file or changed the user's"
    new = tmp_path / ("new" + Path(file_name).suffix)
    with monkeypatch.context() as patch:
        with pytest.raises(Exception) as info:  # whatever the failing write raised, not our refusal
            write(new, False, patch, True)
        assert not isinstance(info.value, UserInputError), info.value
    assert not new.exists() and _snapshot(tmp_path) == before, "a failed write left a partial file"

    with monkeypatch.context() as patch:  # a new path is written; overwrite=True replaces the file whole
        write(new, False, patch, False)
    assert new.is_file() and new.stat().st_size > 0
    with monkeypatch.context() as patch:
        write(target, True, patch, False)
    assert target.read_bytes() != b"the user's file"
    hidden = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert hidden == [], f"temporary files left: {hidden}"


# ------------------------------------------------- the engine journal (issue 37)
class _Engine:
    """A fake engine: every answer correct, whole-vocabulary log-probs; ``calls`` counts prompts asked."""

    def __init__(self, name="fake", d_vocab=None):
        self.name, self.d_vocab, self.calls = name, d_vocab or TASK.vocab.size, 0

    def __call__(self, tokens):
        import torch

        self.calls += tokens.shape[0]
        return torch.log_softmax(torch.zeros(tokens.shape[0], self.d_vocab), dim=-1)


def _journal_batch(n=2, task=TASK):
    return task.generate(n, seed=0, strict=False)


def test_engine_journal_drops_a_torn_batch_and_asks_it_again(tmp_path):
    from phaseinterp.engines.answers import BATCH_DIR, engine_answers

    batch = _journal_batch()
    first = engine_answers(_Engine(), batch, batch_size=4, resume_dir=tmp_path, progress=False)
    files = sorted((tmp_path / BATCH_DIR).glob("batch-*.npz"))
    assert len(files) == len(batch) // 4
    files[-1].write_bytes(files[-1].read_bytes()[:40])  # a copy cut short: torn
    (tmp_path / BATCH_DIR / ".batch-0000000.npz.abc123.tmp").write_bytes(b"a killed write's temporary")
    engine = _Engine()
    with pytest.warns(UserWarning, match="torn"):
        again = engine_answers(engine, batch, batch_size=4, resume_dir=tmp_path, progress=False)
    assert engine.calls == 4, "only the torn batch is asked again"
    assert (again.predicted == first.predicted).all()
    assert not list((tmp_path / BATCH_DIR).glob(".*.tmp")), "a stopped write's temporary was kept"


@pytest.mark.parametrize("change", ["engine", "task", "batch_size"])
def test_engine_journal_of_another_run_is_refused_not_mixed(change, tmp_path):
    from phaseinterp.engines.answers import engine_answers
    from phaseinterp.errors import UserInputError

    engine_answers(_Engine(), _journal_batch(), batch_size=4, resume_dir=tmp_path, progress=False)
    before = _snapshot(tmp_path)
    other_task = KeyValueRetrieval(seq_len=64, n_records=8, n_demos=3, min_distance=20, residue_modulus=8)
    engine, batch, size = _Engine(), _journal_batch(), 4
    if change == "engine":
        engine = _Engine(name="another model")
    elif change == "task":
        batch = _journal_batch(task=other_task)
    else:
        size = 8
    with pytest.raises(UserInputError, match="another run") as info:
        engine_answers(engine, batch, batch_size=size, resume_dir=tmp_path, progress=False)
    assert "resume_dir=" in str(info.value) and engine.calls == 0
    assert _snapshot(tmp_path) == before


def test_engine_journal_refuses_a_folder_that_is_not_one(tmp_path, model):
    from phaseinterp.engines.answers import engine_answers
    from phaseinterp.errors import UserInputError

    mine = _user_files(tmp_path / "mine")
    result = tmp_path / "result"
    _profile(model).save(result)
    before = _snapshot(tmp_path)
    for folder, held in ((mine, "notes.txt"), (result, "PhaseProfile result")):
        engine = _Engine()
        with pytest.raises(UserInputError, match="not an engine-answers journal") as info:
            engine_answers(engine, _journal_batch(), batch_size=4, resume_dir=folder, progress=False)
        assert held in str(info.value) and engine.calls == 0
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("writer", sorted(FILE_WRITERS))
def test_a_file_writer_replaces_what_a_link_points_to_and_keeps_the_link(writer, tmp_path, monkeypatch):
    """A file path that is a link to the user's file: with overwrite the file it points to is replaced, the
    link stays; without overwrite nothing changes. A link to a folder is refused as a folder."""
    from phaseinterp.errors import UserInputError

    write, file_name = FILE_WRITERS[writer]
    suffix = Path(file_name).suffix
    real, link = tmp_path / f"real{suffix}", tmp_path / f"link{suffix}"
    real.write_text("old figure")
    link.symlink_to(real)
    (tmp_path / "page").mkdir()
    (tmp_path / "page" / "index.html").write_text("<html><body>a report</body></html>")
    with pytest.raises(UserInputError, match="already exists"):
        write(link, False, monkeypatch, False)
    assert real.read_text() == "old figure"
    write(link, True, monkeypatch, False)
    assert link.is_symlink() and Path(os.readlink(link)) == real and real.read_bytes() != b"old figure"
    folder, folder_link = tmp_path / "folder", tmp_path / f"folder_link{suffix}"
    folder.mkdir()
    folder_link.symlink_to(folder, target_is_directory=True)
    with pytest.raises(UserInputError, match="is a folder"):
        write(folder_link, True, monkeypatch, False)
    assert folder_link.is_symlink() and list(folder.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["folder", folder_link.name, link.name, "page", real.name]), "a temporary file or moved link was left"


def _out_verbs():
    """Every CLI verb with --out (or --out-dir, --shard-dir), as the argv that runs it on a small checkpoint."""
    from phaseinterp.cli.args import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices
    verbs = {}
    for verb, parser in [*sub.items(), *[(f"zoo {z}", p) for z, p in
                                         sub["zoo"]._subparsers._group_actions[0].choices.items()],
                         *[(f"tokenizer {z}", p) for z, p in
                           sub["tokenizer"]._subparsers._group_actions[0].choices.items()]]:
        flags = [f for a in parser._actions for f in a.option_strings if f in ("--out", "--out-dir", "--shard-dir")]
        for flag in flags:
            verbs[f"{verb} {flag}"] = (verb, flag)
    return verbs


def _argv_for(verb, checkpoint, tmp_path):
    data = tmp_path / "text.jsonl"
    data.write_text(json.dumps({"text": "a line of text " * 20}) + "\n")
    return {"demo": ["demo"], "report": ["report", str(checkpoint)], "profile": ["profile", str(checkpoint)],
            "ablate": ["ablate", str(checkpoint)], "cycle": ["cycle", str(checkpoint)],
            "gates": ["gates", str(checkpoint)], "conformance": ["conformance", str(checkpoint)],
            "merge": ["merge", str(tmp_path)], "zoo export": ["zoo", "export", "dsv4-tiny", "--layout", "deepseek"],
            "lm-eval-task": ["lm-eval-task", str(checkpoint)], "train": ["train", "--steps", "1"],
            "zoo build": ["zoo", "build", "w4s4"],
            "pretrain": ["pretrain", "--preset", "tiny", "--data", str(data), "--tokenizer", str(tmp_path)],
            "tokenizer train": ["tokenizer", "train", "--data", str(data), "--vocab-size", "300"],
            "paper": ["paper", "--no-static"]}[verb]


def test_every_out_verb_is_walked():
    walked = {"demo", "report", "profile", "ablate", "cycle", "gates", "conformance", "merge", "zoo export",
              "lm-eval-task", "train", "zoo build", "pretrain", "tokenizer train", "paper"}
    assert {verb for verb, _ in _out_verbs().values()} == walked


@pytest.mark.parametrize("verb_flag", sorted(_out_verbs()))
def test_every_out_verb_refuses_an_unwritable_place_before_any_work(verb_flag, checkpoint, tmp_path, capsys,
                                                                     monkeypatch):
    """--out (--out-dir, --shard-dir) under /proc: exit 2, one line naming the path, before any model
    loads (a load is patched to fail loudly)."""
    from phaseinterp.models import loading

    if not Path("/proc").is_dir():
        pytest.skip("no /proc on this system")
    verb, flag = _out_verbs()[verb_flag]

    def no_work(*args, **kwargs):
        raise AssertionError("a model was loaded before --out was checked")

    monkeypatch.setattr(loading, "load", no_work)
    target = "/proc/phaseinterp-cannot-write-here"
    assert main(_argv_for(verb, checkpoint, tmp_path) + [flag, target]) == 2, verb_flag
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and target in err and "not writable" in err, (verb_flag, err)


@pytest.mark.parametrize("verb", ["profile", "gates", "lm-eval-task", "ablate"])
def test_an_out_verb_writes_through_a_link_and_never_moves_it(verb, checkpoint, tmp_path, capsys):
    """The issue's instance: --out naming a link to a folder. The folder it points to is written, then
    (--overwrite) replaced; the link stays a link to it, nothing is left beside either."""
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real, target_is_directory=True)
    size = ["--n-per-residue", "23"]
    for extra in ([], ["--overwrite"]):
        assert main(_argv_for(verb, checkpoint, tmp_path) + size + ["--out", str(link), *extra]) == 0, verb
        assert link.is_symlink() and Path(os.readlink(link)) == real and any(real.iterdir())
    capsys.readouterr()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real", "text.jsonl"], "a staging folder was left"


# ----------------------------------------- edited checkpoints and saved results (issue 45, class 3)
@pytest.mark.parametrize("edit", ["local_window", "window", "stride", "gate", "task", "zoo_name"])
def test_an_edited_checkpoint_config_is_refused_by_every_loader(edit, checkpoint, tmp_path):
    """A config.json edited without changing any shape (the model would run with settings it was not
    trained with, under its old label) is refused by every loader, CLI included."""
    import phaseinterp as pi

    folder = tmp_path / "edited"
    shutil.copytree(checkpoint, folder)
    config = json.loads((folder / "config.json").read_text())
    if edit == "task":
        config["metadata"]["task"] = {**config["metadata"].get("task", {}), "seq_len": 65}
    elif edit == "zoo_name":
        config["metadata"]["zoo_name"] = "w4s4"
    else:
        config["model"][edit] = {"local_window": 4, "window": 8, "stride": 2, "gate": "vector"}[edit]
    (folder / "config.json").write_text(json.dumps(config))
    for load in (pi.load, CompressedTransformer.from_pretrained):
        with pytest.raises(CheckpointError, match="was changed after it was saved"):
            load(folder)
    assert main(["profile", str(folder), "--n-per-residue", "23"]) == 2


def test_a_shipped_checkpoint_records_its_config_hash():
    from phaseinterp import zoo
    from phaseinterp.models.transformer import config_hash

    for name in zoo.ENTRIES:
        path = zoo.CHECKPOINT_DIR / name / "config.json"
        if path.is_file():
            config = json.loads(path.read_text())
            assert config.get("config_sha256") == config_hash(config), name


def test_an_edited_saved_result_is_refused_and_impossible_values_too(model, tmp_path):
    """A saved result whose meta.json or arrays.npz changed after the save is refused (its recorded
    SHA-256); one without a record (saved by 0.3) is still checked against each field's range."""
    from phaseinterp import PhaseProfile
    from phaseinterp.errors import UserInputError

    saved = _profile(model).save(tmp_path / "p")
    meta = json.loads((saved / "meta.json").read_text())
    for name, value in (("period_p_value", 7.0), ("confidence", -3), ("homogeneity_p_value", -0.5),
                        ("confidence", 1.0)):
        edited = json.loads(json.dumps(meta))
        edited["fields"][name] = value
        (saved / "meta.json").write_text(json.dumps(edited))
        with pytest.raises(UserInputError, match="was changed after it was saved"):
            PhaseProfile.load(saved)
        edited.pop("content_sha256")
        (saved / "meta.json").write_text(json.dumps(edited))
        with pytest.raises(UserInputError, match=f"{name}=.* is out of range"):
            PhaseProfile.load(saved)
    (saved / "meta.json").write_text(json.dumps(meta))
    arrays = dict(np.load(saved / "arrays.npz"))
    arrays["residue_correct"] = arrays["residue_n"] + 1
    np.savez(saved / "arrays.npz", **arrays)
    with pytest.raises(UserInputError, match="was changed after it was saved"):
        PhaseProfile.load(saved)
    meta.pop("content_sha256")
    (saved / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserInputError, match="residue_correct exceeds residue_n"):
        PhaseProfile.load(saved)


# ------------------------------------------------------------------ lists of indices (`check_indices`)


def _index_doors(model):
    """Each public list-of-indices argument -> the normalized value it keeps (its checker), on ``model``
    (2 layers, 1 KV head, 2 query heads, S = 4)."""
    from phaseinterp import IndexerSpec
    from phaseinterp.engines.check import _check_phases
    from phaseinterp.interventions._common import check_layers
    from phaseinterp.interventions.ablation import _head_groups
    from phaseinterp.interventions.gate_shifts import check_kv_heads, check_shifts

    return {
        "layer": lambda v: check_layers(model, v),  # ablate, shift_gates, gate_cycling_*, specialized_units
        "kv_heads": lambda v: check_kv_heads(model, v),
        "answer_phases": lambda v: list(_check_phases("answer_phases", v, 4)),  # conformance
        "indexer layers": lambda v: list(IndexerSpec(layers=v).layers),
        "heads group": lambda v: list(_head_groups([v], 2)[0]),  # ablate(heads=[group])
        "shifts": lambda v: list(check_shifts(v, 4)[1:]),  # gate_cycling_*: the unshifted 0 first
    }


DOORS = ["layer", "kv_heads", "answer_phases", "indexer layers", "heads group", "shifts"]


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("form", ["list", "tuple", "numpy array", "tensor", "numpy ints"])
def test_every_index_list_takes_numpy_and_torch_forms_as_the_list(door, form, model):
    """A valid list given as a numpy array, a tensor or numpy integers means what the list means
    (arrays were refused as 'out of range' by some arguments and taken by others)."""
    check = _index_doors(model)[door]
    value = [1] if door == "shifts" else [0]
    given = {"list": value, "tuple": tuple(value), "numpy array": np.array(value), "tensor": torch.tensor(value),
             "numpy ints": [np.int64(v) for v in value]}[form]
    with as_user():
        got = check(given)
    assert got == check(value) and all(type(v) is int for v in got)


@pytest.mark.parametrize("door", [d for d in DOORS if d != "shifts"])  # shifts equal mod S: measured, scored once
@pytest.mark.parametrize("bad, words", [([0, 0], "repeats|twice"), ([], r"empty|got \(\)"), ([0.0], "0.0"),
                                        ([True], "True"), ([-1], "-1"), ("0", "'0'"), ({0: 1}, "{0: 1}"),
                                        (np.zeros((1, 1), int), r"\[\[0")])
def test_every_index_list_refuses_the_same_bad_values(door, bad, words, model):
    from phaseinterp.errors import UserInputError

    with as_user(), pytest.raises(UserInputError, match=words):
        _index_doors(model)[door](bad)


# ------------------------------------------------------------------ tensors handed in (`check_tensor`)
def _tensor_doors(model):
    """Each public tensor argument -> (a call with that tensor, a valid tensor)."""
    import phaseinterp as pi

    resid = model(TASK.generate(2, strict=False).tokens[:2], stop_at_layer=1)
    mean = torch.zeros(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    tokens = TASK.generate(2, strict=False).tokens[:4]
    logits = pi.mean_gate_logits(model, tokens)
    name = sorted(logits)[0]

    def static(mu):
        with pi.shift_static_gates(model, 1, layers=None, mean_logits={**logits, name: mu}):
            raise AssertionError("a bad mean_logits entry was taken")

    return {  # door -> (the name its message gives, a call with the tensor, a valid tensor)
        "start_at_layer residual": ("residual", lambda t: model(t, start_at_layer=1), resid),
        "ablate calibration_mean": ("calibration_mean", lambda t: pi.ablate(
            model, TASK, prompts=TASK.generate(23), calibration_mean=t, n_calibration=8, progress=False), mean),
        "shift_static_gates mean_logits": ("mean_logits", static, logits[name]),
    }


TENSOR_CASES = [(door, bad) for door in ["start_at_layer residual", "ablate calibration_mean",
                                         "shift_static_gates mean_logits"]
                for bad in ["nan", "inf", "one size off", "no rows", "integers", "a list"]]
TENSOR_CASES.append(("start_at_layer residual", "float64"))  # a mean is cast where it is used


@pytest.mark.parametrize("door, bad", TENSOR_CASES)
def test_every_tensor_argument_is_checked_before_any_work(door, bad, model):
    """A tensor a user hands in is refused, naming it, when it is not finite, has another shape (a
    mean of another model broadcast silently) or dtype, or is no tensor; the model is unchanged."""
    from phaseinterp.errors import UserInputError

    name, call, good = _tensor_doors(model)[door]
    value = {"nan": good.clone().fill_(float("nan")), "inf": good.clone().fill_(float("inf")),
             "one size off": good[..., :-1], "float64": good.double(), "no rows": good[:0],
             "integers": good.long(), "a list": good.tolist()}[bad]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with as_user(), pytest.raises(UserInputError, match=name):  # were torch errors, NaN / broadcast answers
        call(value)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items()), "the model was changed"


def test_a_residual_past_the_context_is_refused(model):
    from phaseinterp.errors import UserInputError

    with pytest.raises(UserInputError, match=r"positions 0\.\.64 exceed the model's n_ctx=64"):
        model(torch.zeros(1, 65, model.cfg.d_model), start_at_layer=1)  # was torch's IndexError


def test_a_deepseek_v4_residual_past_the_context_is_named_as_positions_with_or_without_input_ids():
    """Too long a DeepSeek-V4 residual is refused by the length check, before its ``input_ids`` (whose
    token check used to answer first, in words about tokens)."""
    from phaseinterp.errors import UserInputError

    model = _dsv4()
    n, cfg = model.cfg.n_ctx + 1, model.cfg
    resid = torch.zeros(1, n, cfg.hc_mult, cfg.d_model)
    for input_ids in (None, torch.zeros(1, n, dtype=torch.long)):
        with pytest.raises(UserInputError, match=rf"positions 0\.\.{n - 1} exceed the model's max_position_embeddings"):
            model(resid, start_at_layer=1, input_ids=input_ids)


# ------------------------------------------------------------------ other things handed in
@pytest.mark.parametrize("call, words", [
    (lambda m: __import__("phaseinterp").gate_profile(m, TASK, prompts=5), "prompts=int is not a prompt batch"),
    (lambda m: __import__("phaseinterp").specialized_units(m, TASK, ablation=5), "ablation must be an AblationResult"),
    (lambda m: __import__("phaseinterp").ConformanceSpec(dtypes=["float16", "float16"]), "repeats a dtype"),
], ids=["gate_profile prompts", "specialized_units ablation", "conformance dtypes"])
def test_a_prepared_input_of_the_wrong_kind_is_named(call, words, model):
    from phaseinterp.errors import UserInputError

    with pytest.raises(UserInputError, match=words):  # were AttributeError / a repeated dtype run twice
        call(model)


@pytest.mark.parametrize("number", [np.int64, np.int32])
def test_numpy_numbers_in_a_config_and_a_task_are_taken_and_saved_as_python_ones(number, tmp_path):
    """Valid numpy numbers are accepted, and stored as the Python numbers they equal: the config's
    hash and the checkpoint's JSON were a TypeError (after any training) with numpy ints."""
    with as_user():
        cfg = CFG.replace(n_ctx=number(64), d_model=number(32), rope_dims=number(8))
        task = KeyValueRetrieval(seq_len=number(64), n_records=number(8), n_demos=2, min_distance=20,
                                 residue_modulus=number(8))
    assert cfg.to_dict() == CFG.replace(rope_dims=8).to_dict() and json.dumps(task.to_dict()) == json.dumps(
        TASK.to_dict())
    model = CompressedTransformer(cfg)
    model.metadata.update(task=task.to_dict(), task_type="KeyValueRetrieval")
    assert CompressedTransformer.from_pretrained(model.save_pretrained(tmp_path / "m")).cfg == cfg


# ------------------------------------------------------------------ caches
def test_a_cache_of_another_geometry_is_refused_and_one_of_the_same_geometry_is_read():
    """A cache made by a model whose cache holds other shapes (another stride, width or KV heads) is
    refused naming both geometries, before any layer runs; another model of the same geometry (other
    weights: cross-model patching) reads it. ``repeat_batch`` takes a count >= 1."""
    tokens = torch.randint(0, CFG.d_vocab, (2, 12), generator=torch.Generator().manual_seed(0))
    model = CompressedTransformer(CFG)
    for other in (CFG.replace(window=6, stride=6), CFG.replace(d_head=8), CFG.replace(compression=None)):
        cache = CompressedTransformer(other).init_cache()
        CompressedTransformer(other)(tokens[:, :11], cache=cache, return_type=None)
        with pytest.raises(ValueError, match=r"cache was made by a model of another geometry \(.*\) than this one"):
            model(tokens[:, 11:], cache=cache)
    twin = CompressedTransformer(CFG.replace(seed=1))
    cache = twin.init_cache()
    twin(tokens[:, :11], cache=cache, return_type=None)
    assert model(tokens[:, 11:], cache=cache).shape == (2, 1, CFG.d_vocab)
    for n in (0, -1, 1.5, True):
        with as_user(), pytest.raises(ValueError, match="n=.* must be an integer >= 1"):
            model.init_cache().repeat_batch(n)


def test_numpy_reals_are_taken_as_python_numbers_by_every_real_check():
    """The real-number class (`check_real`): recipes, the memory plan, the idealized model and engine
    options take numpy numbers as the Python numbers they equal and store those (a recipe is saved as
    JSON); infinities, NaN and bools are refused by name everywhere."""
    from phaseinterp.engines.answers import engine_answers
    from phaseinterp.errors import UserInputError
    from phaseinterp.theory import IdealizedInductionModel
    from phaseinterp.train.compressed import TrainConfig
    from phaseinterp.train.plan import plan_memory
    from phaseinterp.train.pretrain import PretrainConfig

    with as_user():
        tc = TrainConfig(steps=np.int64(8), lr=np.float32(0.5), weight_decay=np.float64(0.1), min_lr_ratio=np.float32(0.5),
                         periodic_fraction=np.float64(0.25), periodic_block=np.array([2, 4]),
                         snapshot_steps=np.arange(1, 4))
        pc = PretrainConfig(seq_len=np.int32(64), lr=np.float32(1e-3), needle_fraction=np.float64(0.5),
                            max_minutes=np.float32(2.0), micro_batch=np.int64(2), global_batch=np.int64(4))
        plan = plan_memory(CFG, pc, device_gib=np.float32(80.0))
        theory = IdealizedInductionModel(4, 2, 2, 1, kappa=np.float64(0.1), beta=np.float32(4.0))
    for recipe in (tc, pc):
        saved = json.loads(json.dumps(dataclasses.asdict(recipe)))  # was a TypeError on numpy numbers
        assert all(type(v) in (int, float, bool, str, list, dict, type(None)) for v in saved.values())
    assert tc.lr == float(np.float32(0.5)) and tc.periodic_block == (2, 4) and tc.snapshot_steps == (1, 2, 3)
    assert type(pc.seq_len) is int and type(pc.max_minutes) is float and plan.device_bytes == 80 * 2**30
    assert theory.kappa == 0.1 and type(theory.beta) is float
    for call, words in [
        (lambda: TrainConfig(lr=np.float32("inf")), "lr=inf must be a finite number"),
        (lambda: TrainConfig(weight_decay=True), "weight_decay=True must be a finite number"),
        (lambda: PretrainConfig(needle_fraction=np.float64("nan")), "needle_fraction=nan must be a finite number"),
        (lambda: PretrainConfig(max_minutes=0), r"max_minutes=0 must be > 0 \(or None"),
        (lambda: plan_memory(CFG, PretrainConfig(), device_gib=float("inf")), "device_gib=inf must be a finite"),
        (lambda: IdealizedInductionModel(4, 2, 2, 1, gamma=np.float64(-1.0)), "gamma=-1 must be > 0"),
        (lambda: engine_answers(_NamedEngine(), None, retry_wait=np.float64("nan")), "retry_wait=nan must be"),
        (lambda: CFG.replace(norm_eps=float("inf")), "norm_eps=inf must be a finite number"),
    ]:
        with pytest.raises(UserInputError, match=words):
            with as_user():
                call()


class _NamedEngine:
    """An engine by the protocol's shape that is never called: the options are refused first."""

    name = "never-called"

    def __call__(self, tokens):
        raise AssertionError("an engine was called before its options were checked")


def test_an_experiments_options_hold_numpy_numbers_as_python_ones():
    """Every options dataclass stores a numpy number as the Python number it equals (a result's spec is
    saved as JSON), and still refuses a numpy value out of range by name."""
    import phaseinterp as pi
    from phaseinterp.errors import UserInputError

    with as_user():
        spec = pi.ProfileSpec(confidence=np.float32(0.9), n_per_residue=np.int64(8), seed=np.int32(3))
        assert (type(spec.confidence), type(spec.n_per_residue), type(spec.seed)) == (float, int, int)
        assert json.loads(json.dumps(spec.options()))["n_per_residue"] == 8
        with pytest.raises(UserInputError, match=r"confidence=1\.5 must be a number in \(0, 1\)"):
            pi.ProfileSpec(confidence=np.float64(1.5))
