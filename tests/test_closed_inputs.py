"""Issue 58: bad input closed by construction. One test per reported instance (each refused or fixed,
with the message naming the argument and its value), then the classes: every output path judged by
one function, options that declare what they need, names resolved at one door, and a period test that
says when its design cannot reach significance."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import phaseinterp as pi
from phaseinterp.cli import main
from phaseinterp.errors import UserInputError
from typecheck import as_user


@pytest.fixture(scope="module")
def w4s4():
    return pi.load("w4s4")




def _cli(capsys, argv):
    """(exit code, stderr) of ``phaseinterp ARGV``."""
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


# ------------------------------------------------------------------ an option beside spec=
def test_an_option_beside_spec_equal_to_its_default_is_refused(w4s4):
    """The reported instance: n_per_residue=72 (the default) beside a spec of 80 ran 80 silently."""
    spec = pi.ProfileSpec(n_per_residue=80, progress=False)
    with pytest.raises(UserInputError, match=r"n_per_residue= given beside spec=.*passed n_per_residue=72, "
                                             r"the spec has n_per_residue=80"):
        pi.phase_profile(w4s4, spec=spec, n_per_residue=72)
    with pytest.raises(UserInputError, match="seed= given beside spec="):
        pi.ablate(w4s4, spec=pi.AblationSpec(), seed=0)
    with pytest.raises(UserInputError, match="batch_size= given beside spec="):
        pi.gate_profile(w4s4, spec=pi.GateProfileSpec(), batch_size=64)


# ------------------------------------------------------------------ raw errors of small helpers
@pytest.fixture(autouse=True)
def _as_user():
    with as_user():
        yield


def test_key_slot_sources_checks_its_integers(w4s4):
    with pytest.raises(UserInputError, match=r"query_pos=5\.5 must be an integer"):
        w4s4.key_slot_sources(0, 5.5)
    with pytest.raises(UserInputError, match=r"n_key_slots=0 must be an integer >= 17"):
        w4s4.key_slot_sources(0, 5, n_key_slots=0)
    with pytest.raises(UserInputError, match=r"kv_head=7 is out of range \(valid: 0\.\.1\)"):
        w4s4.key_slot_sources(0, 5, kv_head=7)
    assert w4s4.key_slot_sources(0, np.int64(5)) == w4s4.key_slot_sources(0, 5)


def test_set_query_chunk_takes_numpy_integers(w4s4):
    try:
        w4s4.set_query_chunk(np.int64(4))
        assert w4s4.query_chunk == 4 and type(w4s4.query_chunk) is int
        for bad in (0, -1, True, 2.5, "16", np.float64(4.0)):
            with pytest.raises(UserInputError, match="query_chunk="):
                w4s4.set_query_chunk(bad)
            assert w4s4.query_chunk == 4
    finally:
        w4s4.set_query_chunk("auto")


def test_save_pretrained_refuses_metadata_json_cannot_hold(w4s4, tmp_path):
    with pytest.raises(UserInputError, match=r"metadata\['t'\]=tensor\(1\) \(Tensor\) cannot be stored as JSON"):
        w4s4.save_pretrained(tmp_path / "ck", metadata={"t": torch.tensor(1)})
    assert not (tmp_path / "ck").exists() and not list(tmp_path.iterdir())
    with pytest.raises(UserInputError, match=r"metadata=\[1\] must be a dict"):
        w4s4.save_pretrained(tmp_path / "ck", metadata=[1])
    out = w4s4.save_pretrained(tmp_path / "ok", metadata={"n": np.int64(3), "x": np.arange(2)})
    stored = json.loads((out / "config.json").read_text())["metadata"]
    assert stored["n"] == 3 and stored["x"] == [0, 1]


def test_from_hf_names_the_argument():
    pytest.importorskip("transformers")
    with pytest.raises(UserInputError, match=r"hf_model='not a model' is a str, not a loaded Hugging Face model.*"
                                             r"load_hf\('not a model'\)"):
        pi.from_hf("not a model")
    with pytest.raises(UserInputError, match=r"hf_model=3 \(int\) is not a Hugging Face model"):
        pi.from_hf(3)


def test_tokenizer_train_has_the_overwrite_flag_its_message_names(tmp_path, capsys):
    pytest.importorskip("tokenizers")
    data = tmp_path / "text.txt"
    data.write_text("def f(x):\n    return x + 1\n" * 200)
    out = tmp_path / "tok"
    assert main(["tokenizer", "train", "--data", str(data), "--vocab-size", "300", "--out", str(out)]) == 0
    code, err = _cli(capsys, ["tokenizer", "train", "--data", data, "--vocab-size", "300", "--out", out])
    assert code == 2 and "--overwrite" in err
    assert main(["tokenizer", "train", "--data", str(data), "--vocab-size", "300", "--out", str(out),
                 "--overwrite"]) == 0


# ------------------------------------------------------------------ Ctrl-C of pretrain
@pytest.mark.parametrize("held, says", [
    ({"pretrain.json": "{}", "checkpoints/LATEST": "step_000094"}, ["step_000094", "is intact", "--resume"]),
    ({"pretrain.json": "{}"}, ["before the first checkpoint", "pretrain.json", "--resume"]),
    ({}, ["nothing in"]),
])
def test_an_interrupted_pretrain_says_what_its_folder_holds(held, says, tmp_path, capsys, monkeypatch):
    from phaseinterp import cli

    run = tmp_path / "pt9"
    for name, text in held.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text(text)
    monkeypatch.setattr(cli.commands, "run", lambda args: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(["pretrain", "--preset", "tiny", "--data", str(tmp_path), "--tokenizer", str(tmp_path),
                 "--out", str(run)]) == 130
    err = capsys.readouterr().err
    assert all(s in err for s in says) and "nothing was written" not in err, err


# ------------------------------------------------------------------ `~` and colliding paths
def test_a_tilde_is_the_home_folder_everywhere(w4s4, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    assert w4s4.save_pretrained("~/ck") == tmp_path / "ck"
    assert pi.load("~/ck").cfg == w4s4.cfg
    gates = pi.gate_profile(w4s4, n_per_residue=1)
    assert gates.save("~/g") == tmp_path / "g"
    assert type(gates).load("~/g").heads.equals(gates.heads)
    code, _ = _cli(capsys, ["gates", "~/ck", "--n-per-residue", "1", "--out=~/my_gates"])
    assert code == 0 and (tmp_path / "my_gates" / "meta.json").is_file()
    assert not (tmp_path / "cwd" / "~").exists()


@pytest.mark.parametrize("argv, says", [
    (["profile", "w4s4", "--shard-dir", "{t}/x", "--out", "{t}/x"], "--out and --shard-dir are the same folder"),
    (["profile", "w4s4", "--shard-dir", "{t}/x/s", "--out", "{t}/x"], "--shard-dir '{t}/x/s' is inside --out"),
    (["cycle", "w4s4", "--baseline", "{t}/base", "--out", "{t}/base"], "--out '{t}/base' is the input --baseline"),
])
def test_colliding_paths_are_refused_before_any_work(argv, says, tmp_path, capsys, monkeypatch):
    from phaseinterp.cli import commands

    (tmp_path / "base").mkdir()
    monkeypatch.setattr(commands.loading, "load", lambda *a, **k: pytest.fail("the model loaded"))
    code, err = _cli(capsys, [a.replace("{t}", str(tmp_path)) for a in argv])
    assert code == 2 and says.replace("{t}", str(tmp_path)) in err, err


def test_a_dangling_link_as_output_is_named(w4s4, tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    with pytest.raises(UserInputError, match="is a dangling link"):
        w4s4.save_pretrained(tmp_path / "link")


# ------------------------------------------------------------------ flags that act or are refused
# Each flag that needs another, given without it: refused before any work, naming both (the fixture of
# the flag walk: `test_every_flag_of_the_experiment_commands_is_declared`).
INERT = [
    (["profile", "w4s4", "--model-name", "m"], "--model-name applies to --engine only"),
    (["profile", "w4s4", "--top-logprobs", "5"], "--top-logprobs applies to --engine only"),
    (["profile", "w4s4", "--d-vocab", "10"], "--d-vocab applies to --engine only"),
    (["profile", "w4s4", "--retries", "1"], "--retries applies to --engine only"),
    (["profile", "w4s4", "--timeout", "5"], "--timeout applies to --engine only"),
    (["profile", "w4s4", "--seq-len", "64"], "--seq-len applies to --tokenizer only"),
    (["profile", "w4s4", "--tokenizer", "{t}"], "--tokenizer applies to --engine only"),
    (["profile", "w4s4", "--chunk-size", "8"], "--chunk-size applies to --shard-dir or --engine only"),
    (["profile", "w4s4", "--overwrite"], "--overwrite applies to --out or --paper-figure only"),
    (["profile", "w4s4", "--hold", "3"], "--hold applies to --axis length only"),
    (["profile", "w4s4", "--hold", "0"], "--hold applies to --axis length only"),  # its default, given
    (["profile", "w4s4", "--engine", "http://localhost:9", "--model-name", "m", "--query-chunk", "4"],
     "--query-chunk does nothing with --engine"),
    (["profile", "w4s4", "--engine", "http://localhost:9", "--model-name", "m", "--device", "cpu"],
     "--device does nothing with --engine"),
    (["ablate", "w4s4", "--chunk-size", "8"], "--chunk-size applies to --shard-dir only"),
    (["cycle", "w4s4", "--measure", "accuracy"], "--measure applies to --score unit only"),
    (["cycle", "w4s4", "--score", "unit", "--layer", "0", "--branch", "k"], "--branch applies to --score profile only"),
    (["gates", "w4s4", "--overwrite"], "--overwrite applies to --out only"),
    (["conformance", "w4s4", "--modes", "decode", "--dtypes", "float16"], "--dtypes applies to --modes including dtype"),
]


@pytest.mark.parametrize("argv, says", INERT, ids=[" ".join(a[2:4]) for a, _ in INERT])
def test_a_flag_that_would_do_nothing_is_refused(argv, says, tmp_path, capsys, monkeypatch):
    from phaseinterp.cli import commands

    monkeypatch.setattr(commands.loading, "load", lambda *a, **k: pytest.fail("the model loaded"))
    code, err = _cli(capsys, [a.replace("{t}", str(tmp_path)) for a in argv])
    assert code == 2 and says in err, err


def test_spec_needs_are_declared_once(w4s4):
    with pytest.raises(UserInputError, match=r"hold= applies to axis='length' only"):
        pi.ProfileSpec(hold=0)
    with pytest.raises(UserInputError, match=r"dtypes= applies to modes including 'dtype' only"):
        pi.ConformanceSpec(modes=("decode",), dtypes=("float16",))
    assert pi.ConformanceSpec(modes=("dtype",), dtypes=("float16",)).dtypes == ("float16",)


def test_ablate_custom_heads_are_checked(w4s4):
    with pytest.raises(UserInputError, match=r"heads=\[\[1\]\] replaces scope= \(scope='layer' would be ignored\)"):
        pi.ablate(w4s4, scope="layer", heads=[[1]])
    with pytest.raises(UserInputError, match=r"the group \[0\] is given twice"):
        pi.ablate(w4s4, heads=[[0], [0]])
    with pytest.raises(UserInputError, match=r"the group \[0, 0\] names a query head twice"):
        pi.ablate(w4s4, heads=[[0, 0], [0, 0]])
    with pytest.raises(UserInputError, match=r"the group \[1, 0\] is given twice"):
        pi.ablate(w4s4, heads=[[0, 1], [1, 0]])


# ------------------------------------------------------------------ prompt sets that lack residues
def test_a_prompt_set_that_lacks_residues_is_refused_naming_them(w4s4):
    """The reported instance: task.generate(72).subset(slice(0, 100)) gave all-NaN phase accuracies."""
    batch = pi.zoo.task_for(w4s4).generate(72)
    part = batch.subset(slice(0, 100))
    missing = sorted(set(range(24)) - set(part.meta["residue"]))
    assert missing
    for call in (lambda: pi.phase_profile(w4s4, part), lambda: pi.ablate(w4s4, prompts=part),
                 lambda: pi.gate_cycling_profile(w4s4, prompts=part, shifts=[1])):
        with pytest.raises(UserInputError, match=r"hold prompts of \d+ of the 24 residues \(missing residues "):
            call()
    few = batch.subset((batch.meta.groupby("residue").cumcount() < 3).to_numpy())  # the way the message says
    profile = pi.phase_profile(w4s4, few, n_permutations=99)
    assert np.isfinite(profile.phase_accuracy).all() and len(few) == 72


def test_records_that_lack_residues_never_make_a_profile(tmp_path):
    import pandas as pd

    from phaseinterp.profile import profile_from_records

    records = pd.DataFrame({"residue": np.arange(10) % 5, "correct": np.ones(10, bool)})
    with pytest.raises(UserInputError, match=r"the records hold prompts of 5 of the 8 residues \(missing residues 5\.\.7\)"):
        profile_from_records(records, 8, 4)


# ------------------------------------------------------------------ a test that cannot say yes says so
def test_a_period_test_that_cannot_reach_significance_says_undetermined():
    """The reported instance: 8 residues, a perfect period-4 pattern (accuracy [1 1 1 0 1 1 1 0]) read
    `period None` at p 0.14, the best this design can give; 12 residues of the same engine read 4."""
    import pandas as pd

    from phaseinterp import stats
    from phaseinterp.profile import profile_from_records

    test = stats.detect_period([1, 1, 1, 0, 1, 1, 1, 0], seed=0)
    assert test.period is None and test.undetermined
    assert 0.1 < test.min_attainable_p < 0.2 and test.min_attainable_p > test.alpha
    assert "undetermined at this design" in test.verdict(8) and "R=12" in test.verdict(8)
    assert stats.detect_period([1, 1, 1, 0] * 3, seed=0).period == 4
    noise = stats.detect_period(np.random.default_rng(0).random(24), seed=0)
    assert noise.period is None and not noise.undetermined and noise.verdict().startswith("none")

    residues = np.repeat(np.arange(8), 50)
    records = pd.DataFrame({"residue": residues, "correct": residues % 4 != 3})
    profile = profile_from_records(records, 8, 4, axis="length")
    assert profile.period is None and profile.period_undetermined
    assert profile.to_dict()["period_verdict"].startswith("undetermined at this design")
    assert "undetermined" in profile.summary().loc["period_verdict", "value"]
    assert "undetermined at this design" in profile.plot().layout.title.text


# ------------------------------------------------------------------ a browser that dies at start
@pytest.fixture
def dying_browser(tmp_path, monkeypatch):
    """A "Chromium" that exits at once (root without --no-sandbox, a snap stub on PATH)."""
    pytest.importorskip("kaleido")
    browser = tmp_path / "chromium"
    browser.write_text("#!/bin/sh\necho 'dying browser' >&2\nexit 1\n")
    browser.chmod(0o755)
    monkeypatch.setenv("BROWSER_PATH", str(browser))
    return browser


def test_a_dying_browser_fails_the_export_fast_and_leaves_nothing(dying_browser, tmp_path):
    """The reported hang: `report` with such a browser printed every section, then waited forever on
    kaleido's task queue (its server thread had died); nothing written, `.R.*.tmp` left beside it."""
    import time

    import plotly.graph_objects as go

    from phaseinterp.plot import export

    fig = go.Figure(go.Scatter(y=[1, 2]))
    out = tmp_path / "out"
    started = time.monotonic()
    with pytest.raises(export.ExportError, match="stopped while drawing|could not write"):
        with export.static_session(True):
            export.save_static({out / "a.png": fig, out / "b.png": fig})
    assert time.monotonic() - started < 60
    assert not [p for p in out.iterdir()] if out.exists() else True
    with pytest.raises(export.ExportError):  # without a session: the one-shot path raises too
        export.save(fig, tmp_path / "x.png")
    assert not list(tmp_path.glob(".*.tmp*")) and not (tmp_path / "x.png").exists()


# ------------------------------------------------------------------ names at one door
def test_a_names_filter_that_matches_nothing_is_an_error_not_an_empty_cache(w4s4):
    tokens = torch.zeros(1, 8, dtype=torch.long)
    with pytest.raises(UserInputError, match=r"hook name 'blocks.0.hook_resid_pots' is not a hook point.*closest: "
                                             r"blocks.0.hook_resid_post"):
        w4s4.run_with_cache(tokens, names_filter="blocks.0.hook_resid_pots")
    with pytest.raises(UserInputError, match=r"hook name 'blocks.9.attn.hook_z' is not a hook point"):
        w4s4.run_with_cache(tokens, names_filter=["blocks.0.attn.hook_z", "blocks.9.attn.hook_z"])
    with pytest.raises(UserInputError, match="matches no hook point"):
        w4s4.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_nothing"))
    with pytest.raises(UserInputError, match=r"names_filter=\[\] names no hook point"):
        w4s4.run_with_cache(tokens, names_filter=[])
    _, cache = w4s4.run_with_cache(tokens, names_filter=["blocks.0.attn.hook_z"])
    assert list(cache.keys()) == ["blocks.0.attn.hook_z"]
    assert not any(h.fwd_hooks for h in w4s4.hook_dict.values())


def test_a_tilde_is_the_home_folder_for_text_and_tokenizers(tmp_path, monkeypatch):
    pytest.importorskip("tokenizers")
    from phaseinterp.train.corpus import documents, source_files
    from phaseinterp.train.tokenizer import TextTokenizer, train_tokenizer

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "text.txt").write_text("def f(x):\n    return x + 1\n" * 200)
    assert source_files("~/text.txt") == [tmp_path / "text.txt"]
    assert next(documents("~/text.txt"))[0] == "text.txt:0"
    assert train_tokenizer("~/text.txt", 300, "~/tok", progress=False) == tmp_path / "tok"
    assert 257 < TextTokenizer("~/tok").vocab_size <= 300  # as many merges as the text holds


def test_cycling_identification_says_when_one_shift_cannot_be_significant():
    """Per shift, identification rests on S-1 = 3 points at S = 4: 6 arrangements, p >= 1/6 whatever the
    data; the result says so beside the joint test's floor (1/216 for three shifts)."""
    from phaseinterp.interventions.cycling_stats import attainable_note, cycling_scores

    acc0 = np.array([0.9, 0.8, 0.7, 0.1])
    observed = {d: np.roll(acc0, d) for d in (1, 2, 3)}
    scores = cycling_scores(acc0, observed, n_permutations=999)
    assert scores["identification_min_p_by_shift"] == pytest.approx(1 / 6)
    assert scores["identification_min_p"] == pytest.approx(1 / 216)
    assert (scores["per_shift"]["identification_p"] >= 1 / 6 - 1e-12).all()
    note = attainable_note("identification per shift", 1 / 6, design="3 points per shift")
    assert note.startswith("identification per shift undetermined at this design: its p cannot go below 0.167")
    assert attainable_note("joint", 1 / 216) is None


def test_paper_list_writes_nothing_and_says_so(tmp_path, capsys):
    code, err = _cli(capsys, ["paper", "--list", "--out", tmp_path / "p"])
    assert code == 2 and "--out does nothing with --list" in err, err
    assert not (tmp_path / "p").exists()


def test_a_twin_is_the_full_attention_model_of_the_same_backbone(tmp_path, capsys):
    from phaseinterp.report import check_twin

    check_twin("w4s4", "full")  # the zoo's pair
    with pytest.raises(UserInputError, match=r"twin='w4s4-staggered' is a compressed model"):
        check_twin("w4s4", "w4s4-staggered")
    with pytest.raises(UserInputError, match=r"twin='deep12-full' is not the model's full-attention twin: its "
                                             r"backbone differs \(n_layers 2 vs 12"):
        check_twin("w4s4", "deep12-full")
    code, err = _cli(capsys, ["report", "w4s4", "--twin", "w4s4-staggered", "--out", tmp_path / "r"])
    assert code == 2 and "is a compressed model" in err and "is the model itself" not in err, err


def test_profile_options_that_cannot_act_are_refused(w4s4):
    with pytest.raises(UserInputError, match=r"n_bootstrap= applies to interval 'auto' or 'cluster_bootstrap' only "
                                             r"\(interval='wilson' here"):
        pi.phase_profile(w4s4, interval="wilson", n_bootstrap=50)
    with pytest.raises(UserInputError, match=r"tokenizer= does not apply to KeyValueRetrieval"):
        pi.phase_profile(w4s4, tokenizer=object(), n_permutations=9)


def test_engine_d_vocab_below_the_model_s_vocabulary_is_refused(tmp_path, capsys):
    code, err = _cli(capsys, ["profile", "w4s4", "--engine", "http://localhost:9", "--model-name", "m",
                              "--d-vocab", "10"])
    assert code == 2 and "--d-vocab 10 is smaller than w4s4's vocabulary" in err, err


def test_zoo_build_of_an_hf_recipe_refuses_a_device_it_cannot_use(tmp_path, capsys, monkeypatch):
    """`zoo build dsv4-tiny --device cuda` trained on the CPU without a word: the HF DeepSeek-V4 recipes train
    on the CPU only, so another device is refused before any work (``--device cpu``, what runs, is taken)."""
    from phaseinterp.cli import commands

    monkeypatch.setattr(commands.hf_zoo, "build", lambda *a, **k: pytest.fail("the recipe trained"))
    monkeypatch.setattr(commands, "check_device", lambda device, name="device": torch.device(device))  # a CUDA machine
    code, err = _cli(capsys, ["zoo", "build", "dsv4-tiny", "--device", "cuda", "--no-install"])
    assert code == 2 and "--device cuda: the HF DeepSeek-V4 recipes" in err and "CPU only" in err, err
    built = []
    monkeypatch.setattr(commands.hf_zoo, "build", lambda name, out_dir, **k: built.append(name) or tmp_path)
    assert main(["zoo", "build", "dsv4-tiny", "--device", "cpu", "--no-install", "--out-dir", str(tmp_path / "r")]) == 0
    assert built == ["dsv4-tiny"]


def test_pretrain_resume_with_no_run_is_refused(tmp_path, capsys):
    """`pretrain --resume` into a new folder started a new run without a word; now it names the folder."""
    (tmp_path / "text.txt").write_text("some text\n")
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    code, err = _cli(capsys, ["pretrain", "--preset", "tiny", "--data", tmp_path / "text.txt", "--tokenizer",
                              tmp_path / "tok", "--out", tmp_path / "new", "--resume"])
    assert code == 2 and "holds no run to resume (no pretrain.json)" in err, err


def test_an_output_folder_that_cannot_take_the_staged_write_is_refused_before_any_work(tmp_path, monkeypatch):
    """A staged writer makes its folder beside an existing output folder and moves it into place. The
    current folder (``--out .``) would leave the process in a deleted folder, and a folder under a
    dangling link or in a place that takes no new folder would fail only after the work: each is refused
    by the check that runs first, and nothing is written."""
    profile = pi.paper.profile("kvc_w8s8_1kv_baseline")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    for path in (".", "./", str(here)):
        with pytest.raises(UserInputError, match="is the current folder or holds it"):
            profile.save(path)
    previous = profile.save(tmp_path / "previous")
    monkeypatch.chdir(previous)  # inside a previous result, replacing it
    with pytest.raises(UserInputError, match="is the current folder or holds it"):
        profile.save(".", overwrite=True)
    monkeypatch.chdir(here)
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    with pytest.raises(UserInputError, match="'.*dangling' is a dangling link or a link loop"):
        profile.save(tmp_path / "dangling" / "sub")
    assert list(here.iterdir()) == [] and not (tmp_path / "gone").exists()
    saved = profile.save("sub")  # a folder below the current one is fine
    assert pi.PhaseProfile.load(saved) == profile and Path.cwd() == here


def test_overwrite_never_takes_a_user_s_files_from_a_result_folder(tmp_path):
    profile = pi.paper.profile("kvc_w8s8_1kv_baseline")
    folder = profile.save(tmp_path / "p")
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(UserInputError, match="and also notes.txt, which replacing it would delete"):
        profile.save(folder, overwrite=True)
    assert (folder / "notes.txt").read_text() == "mine" and pi.PhaseProfile.load(folder) == profile


def test_the_remedy_s_runs_never_go_into_a_saved_object_s_folder(tmp_path):
    from phaseinterp.experiments.remedy import train_share

    folder = pi.paper.profile("kvc_w8s8_1kv_baseline").save(tmp_path / "p")
    with pytest.raises(UserInputError, match="holds a PhaseProfile result: the twin runs go in a folder of their own"):
        train_share(folder, 10, 0, 2)
    assert sorted(p.name for p in folder.iterdir()) == ["arrays.npz", "meta.json"]


@pytest.mark.parametrize("name, says", [("fig.txt", r"format\(s\) \['txt'\] not supported"),
                                        ("fig", r"--paper-figure='.*fig.html' already exists")])
def test_a_paper_figure_path_is_judged_before_the_profile_runs(name, says, tmp_path, capsys):
    """The path is judged as `save` will write it (no suffix: .html) and before the work: a format that
    cannot be written, or the user's own fig.html, is refused without a profile run."""
    (tmp_path / "fig.html").write_text("mine")
    assert main(["profile", "w4s4", "--paper", "kvc_w8s8_1kv_baseline", "--paper-figure", str(tmp_path / name)]) != 0
    captured = capsys.readouterr()
    assert re.search(says, captured.err) and "beside the paper" not in captured.out
    assert (tmp_path / "fig.html").read_text() == "mine"


@pytest.mark.parametrize("seeds, says", [((1, 1), r"repeats \[1\]: pass each seed once"), ((), "non-empty list"),
                                         ((0, 2**64), "must be an integer in 0..2")])
def test_the_remedy_s_seeds_are_checked_before_a_run_trains(seeds, says, tmp_path):
    """A repeated seed trained the same twin runs twice and counted them twice; refused before any run."""
    from phaseinterp.experiments.remedy import compare_remedy, train_share

    with pytest.raises(UserInputError, match=says):
        train_share(tmp_path / "runs", 10, 0, 1, seeds=seeds)
    with pytest.raises(UserInputError, match=says):
        compare_remedy(tmp_path / "runs", seeds=seeds, stop_at=10)
    assert not (tmp_path / "runs").exists()
