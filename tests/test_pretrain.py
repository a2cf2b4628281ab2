"""Pretraining on natural text (phaseinterp.train.pretrain): corpus readers, the tokenizer, the
natural-text needle, exact resume, 1 vs 2 processes (torchrun, gloo, FSDP2), checkpoints across
process counts, presets, and the bad inputs refused before any process starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from phaseinterp.config import PRESETS, preset
from phaseinterp.models import parameter_count
from phaseinterp.errors import UserInputError

ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "PHASEINTERP_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}


def _paragraphs() -> list[str]:
    """English text from the standard library's own documentation (pydoc's topics): on every Python."""
    from pydoc_data.topics import topics

    return [p for k in sorted(topics) for p in topics[k].split("\n\n") if len(p) > 80]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    from phaseinterp.train.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("corpus")
    data = root / "topics.jsonl"
    data.write_text("".join(json.dumps({"text": p}) + "\n" for p in _paragraphs()))
    tokenizer = train_tokenizer(data, 1024, root / "tokenizer", progress=False)
    return {"data": data, "tokenizer": tokenizer, "root": root}


def _recipe(**changes):
    from phaseinterp.train.pretrain import PretrainConfig

    settings = dict(seq_len=64, global_batch=4, steps=20, lr=3e-3, warmup_steps=5, probe_every=10,
                    probe_per_residue=1, checkpoint_every=10, needle_fraction=0.25)
    return PretrainConfig(**{**settings, **changes})


def _cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phaseinterp", *args], capture_output=True, text=True, env=ENV,
                          timeout=timeout)


def _pretrain_args(corpus, out, *extra) -> list[str]:
    return ["pretrain", "--preset", "tiny", "--data", str(corpus["data"]), "--tokenizer", str(corpus["tokenizer"]),
            "--seq-len", "64", "--global-batch", "4", "--steps", "20", "--needle-fraction", "0.25",
            "--config", str(_config_file(out.parent)), "--out", str(out), *extra]


def _config_file(folder: Path) -> Path:
    path = folder / "recipe.json"
    path.write_text(json.dumps({"train": {"warmup_steps": 5, "probe_every": 10, "probe_per_residue": 1,
                                          "checkpoint_every": 10}}))
    return path


# ------------------------------------------------------------------ data
def test_every_source_kind_reads_the_same_documents(tmp_path):
    from phaseinterp.train.corpus import documents

    texts = ["first document, plain prose.", "second one\nwith two lines.", "third."]
    (tmp_path / "txt").mkdir()
    for i, t in enumerate(texts):
        (tmp_path / "txt" / f"{i}.txt").write_text(t)
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    assert [t for _, t in documents(tmp_path / "txt")] == texts
    assert [t for _, t in documents(tmp_path / "c.jsonl")] == texts
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": texts}), tmp_path / "c.parquet")
    assert [t for _, t in documents(tmp_path / "c.parquet")] == texts
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(tmp_path / "ds"))
    assert [t for _, t in documents(tmp_path / "ds")] == texts


def test_batch_rows_are_a_function_of_seed_and_step_not_of_the_split():
    from phaseinterp.train.corpus import packed_rows

    tokens = np.arange(10_000, dtype=np.uint32)
    whole = packed_rows(tokens, 32, seed=3, step=7, rows=range(0, 8))
    halves = torch.cat([packed_rows(tokens, 32, 3, 7, range(0, 4)), packed_rows(tokens, 32, 3, 7, range(4, 8))])
    assert torch.equal(whole, halves) and whole.shape == (8, 33)
    assert torch.equal(whole[:, 1:] - whole[:, :-1], torch.ones(8, 32, dtype=torch.long))  # contiguous windows
    assert not torch.equal(whole, packed_rows(tokens, 32, 3, 8, range(0, 8)))
    assert not torch.equal(whole, packed_rows(tokens, 32, 4, 7, range(0, 8)))


def test_tokenized_corpus_is_reused_and_splits_documents(corpus, tmp_path):
    from phaseinterp.train.corpus import tokenize_corpus
    from phaseinterp.train.tokenizer import TextTokenizer

    tok = TextTokenizer(corpus["tokenizer"])
    first = tokenize_corpus(corpus["data"], tok, tmp_path / "cache", progress=False)
    mtime = (tmp_path / "cache" / "train.bin").stat().st_mtime_ns
    again = tokenize_corpus(corpus["data"], tok, tmp_path / "cache", progress=False)
    assert (tmp_path / "cache" / "train.bin").stat().st_mtime_ns == mtime and again.manifest == first.manifest
    m = first.manifest
    assert m["train_tokens"] > 100_000 and m["heldout_tokens"] > 1000 and m["heldout_documents"] >= 1
    # the held-out documents' first 200 tokens can be a grammar rule with no English word in it, so the
    # whole held-out split is read back
    text = tok.decode(first.tokens("heldout").tolist())
    assert any(w in text for w in (" the ", " a ", " is ")), text[:400]  # English, decoded back


def test_the_held_out_split_does_not_depend_on_where_the_corpus_lies(corpus, tmp_path, monkeypatch):
    """A copy of the corpus in another folder, or the same one named by a relative path, splits into the
    same held-out documents: the split is keyed on the file within the source, not on its path."""
    import shutil

    from phaseinterp.train.corpus import documents, is_held_out, tokenize_corpus
    from phaseinterp.train.tokenizer import TextTokenizer

    folder = tmp_path / "a" / "docs"
    (folder / "sub").mkdir(parents=True)
    shutil.copy(corpus["data"], folder / "sub" / "topics.jsonl")
    (folder / "notes.txt").write_text("first note\n\nsecond note\n")
    copy = tmp_path / "elsewhere" / "renamed"
    shutil.copytree(folder, copy)
    monkeypatch.chdir(tmp_path / "a")
    keys = [key for key, _ in documents(folder)]
    assert keys == [key for key, _ in documents(copy)] == [key for key, _ in documents("docs")]
    assert keys[0] == "notes.txt:0" and keys[-1].startswith("sub/topics.jsonl:")
    assert [key for key, _ in documents(corpus["data"])][0] == "topics.jsonl:0"
    held = [is_held_out(key, 0.1) for key in keys]
    assert 0 < sum(held) < len(held)  # both splits hold documents, so equal splits mean something
    tok = TextTokenizer(corpus["tokenizer"])
    here = tokenize_corpus(folder, tok, tmp_path / "cache_a", heldout_fraction=0.1, progress=False)
    there = tokenize_corpus(copy, tok, tmp_path / "cache_b", heldout_fraction=0.1, progress=False)
    assert here.manifest["heldout_documents"] == there.manifest["heldout_documents"] == sum(held)
    assert np.array_equal(here.tokens("heldout"), there.tokens("heldout"))


def test_trained_tokenizer_loads_in_transformers(corpus):
    transformers = pytest.importorskip("transformers")
    from phaseinterp.train.tokenizer import TextTokenizer

    ours = TextTokenizer(corpus["tokenizer"])
    theirs = transformers.AutoTokenizer.from_pretrained(str(corpus["tokenizer"]))
    text = "The return statement leaves the current function call."
    assert theirs.encode(text, add_special_tokens=False) == ours.encode(text)
    assert ours.eos_id == theirs.eos_token_id


# ------------------------------------------------------------------ the needle in text
def test_text_needle_sets_records_into_held_out_text(corpus, tmp_path):
    from phaseinterp.tasks import TextNeedle, resolve_task
    from phaseinterp.train.corpus import tokenize_corpus
    from phaseinterp.train.tokenizer import TextTokenizer

    tok = TextTokenizer(corpus["tokenizer"])
    heldout = tokenize_corpus(corpus["data"], tok, tmp_path / "cache", progress=False).tokens("heldout")
    task = TextNeedle.from_tokenizer(tok, heldout, seq_len=256, residue_modulus=8, target_window=60)
    batch = task.generate(32, seed=0, stride=4)
    assert batch.tokens.shape == (8 * 32, 256)
    moments = batch.meta.groupby("residue").target_pos.agg(["mean", "std"])
    assert moments["mean"].max() - moments["mean"].min() <= 0.5  # position statistics held fixed
    keys, values = set(task.key_ids), set(task.value_ids)
    for row, meta in zip(batch.tokens[:8], batch.meta.itertuples()):
        p = meta.target_pos
        assert set(row[p : p + 2].tolist()) <= keys and set(row[p + 2 : p + 4].tolist()) <= values
        assert row[p + 2].item() == meta.answer  # the first value token is the answer
        assert row[-2:].tolist() == row[p : p + 2].tolist()  # the prompt ends with the target's key
    text = np.asarray(task.filler_text)
    row = batch.tokens[0].numpy()
    plain = row[[t not in keys | values for t in row]]
    # the filler is corpus text: most 4-grams of the non-record tokens occur in the held-out text
    grams = {tuple(text[i : i + 4]) for i in range(len(text) - 3)}
    def hit_rate(tokens):
        return np.mean([tuple(tokens[i : i + 4]) in grams for i in range(len(tokens) - 3)])

    # corpus words that are key or value pieces leave gaps, so not every 4-gram survives; the same
    # tokens shuffled (same unigrams, no text order) are the chance level the filler must beat
    hits, shuffled = hit_rate(plain), hit_rate(np.random.default_rng(0).permutation(plain))
    assert hits > 0.6 and shuffled < 0.2, (hits, shuffled)
    rows = task.training_rows(4, seed=1, text=np.arange(1000, 3000) % 1000)
    assert rows.shape == (4, 257)
    assert TextNeedle.from_dict(json.loads(json.dumps(task.to_dict()))) == task

    class Stored:
        metadata = {"task": task.to_dict(), "task_type": "TextNeedle"}

    assert resolve_task(Stored()) == task


def test_a_vocabulary_without_words_cannot_hold_the_needle(tmp_path):
    from phaseinterp.tasks import TextNeedle
    from phaseinterp.train.tokenizer import TextTokenizer, train_tokenizer

    (tmp_path / "d.txt").write_text("0123456789 " * 500)
    tok = TextTokenizer(train_tokenizer(tmp_path / "d.txt", 300, tmp_path / "tok", progress=False))
    with pytest.raises(UserInputError, match="single-token lowercase words; the needle task needs"):
        TextNeedle.pieces(tok)


# ------------------------------------------------------------------ presets
def test_presets_and_their_parameter_counts():
    qwen = parameter_count(preset("qwen3-0.6b"))
    assert 0.5e9 <= qwen <= 0.7e9, qwen
    assert 0.5e9 <= parameter_count(preset("qwen3-0.6b", compression=None)) <= qwen
    assert 0.08e9 <= parameter_count(preset("qwen3-100m")) <= 0.13e9
    cfg = preset("qwen3-0.6b", stride=4, window=8, n_kv_heads=1, gate="vector")
    assert (cfg.stride, cfg.window, cfg.n_kv_heads, cfg.gate, cfg.n_layers) == (4, 8, 1, "vector", 28)
    with pytest.raises(UserInputError, match="preset='qwen9' is not one of"):
        preset("qwen9")
    with pytest.raises(UserInputError, match=r"preset overrides \['strid'\] are not CompressedConfig fields"):
        preset("tiny", strid=4)
    assert set(PRESETS) >= {"tiny", "cpu-small", "qwen3-100m", "qwen3-0.6b"}


def test_tied_embeddings_unembed_with_the_embedding():
    from phaseinterp.models import CompressedTransformer

    model = CompressedTransformer(preset("tiny"))
    assert "W_U" not in dict(model.named_parameters())
    assert model.W_U.data_ptr() == model.W_E.data_ptr() and model.W_U.shape == (32, 512)
    tokens = torch.randint(0, 512, (2, 16))
    assert torch.allclose(model(tokens)[:, -1], model.last_logits(tokens), atol=1e-5)


# ------------------------------------------------------------------ runs
def test_micro_batches_and_activation_checkpointing_compute_the_same_step():
    from phaseinterp.models import CompressedTransformer
    from phaseinterp.train.pretrain import PretrainConfig, autocast_for, train_step
    from phaseinterp.train.recipe import adamw

    rows = torch.randint(0, 512, (4, 33), generator=torch.Generator().manual_seed(1))
    cpu = autocast_for(torch.device("cpu"))
    states, losses = [], []
    for micro, recompute in ((4, False), (1, False), (2, True)):
        model = CompressedTransformer(preset("tiny")).train()
        model.activation_checkpointing = recompute
        optimizer = adamw(model, PretrainConfig())
        losses.append(train_step(model, optimizer, rows, micro=micro, grad_clip=1.0, autocast=cpu).item())
        states.append(model.state_dict())
    assert losses[0] == pytest.approx(losses[1], rel=1e-6) == pytest.approx(losses[2], rel=1e-6)
    for other in states[1:]:
        for name, value in states[0].items():
            torch.testing.assert_close(other[name], value, rtol=1e-4, atol=1e-5)  # one AdamW step of float noise


def test_activation_checkpointing_keeps_a_users_hook_and_saves_less():
    from phaseinterp.models import CompressedTransformer

    tokens = torch.randint(0, 512, (2, 16))
    grads, saved = [], []
    for recompute in (False, True):
        model = CompressedTransformer(preset("tiny")).train()
        model.activation_checkpointing = recompute
        model.blocks[0].hook_resid_post.add_hook(lambda x, hook: x * 0.5)
        count = [0]

        def pack(t, count=count):
            count[0] += 1
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(tokens, return_type="loss")
        loss.backward()
        grads.append((loss.item(), model.W_E.grad.clone()))
        saved.append(count[0])
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-6)
    torch.testing.assert_close(grads[1][1], grads[0][1], rtol=1e-5, atol=1e-7)
    assert saved[1] < saved[0] / 2, saved  # the blocks' intermediates are recomputed, not kept


def test_text_needle_prefix_padding_keeps_the_moments(corpus, tmp_path):
    from phaseinterp.tasks import TextNeedle
    from phaseinterp.train.corpus import tokenize_corpus
    from phaseinterp.train.tokenizer import TextTokenizer

    tok = TextTokenizer(corpus["tokenizer"])
    heldout = tokenize_corpus(corpus["data"], tok, tmp_path / "cache", progress=False).tokens("heldout")
    task = TextNeedle.from_tokenizer(tok, heldout, seq_len=256, residue_modulus=8, target_window=60, padding="prefix")
    batch = task.generate(32, seed=0, stride=4)
    moments = batch.meta.groupby("residue").target_pos.agg(["mean", "std"])
    assert moments["mean"].max() - moments["mean"].min() <= 0.5
    assert set(batch.meta.padding) == {"prefix"}


def test_resume_at_step_10_equals_the_uninterrupted_run(corpus, tmp_path):
    from phaseinterp.train.pretrain import pretrain

    cfg = preset("tiny", d_vocab=1024)
    whole = pretrain(cfg, corpus["data"], corpus["tokenizer"], _recipe(), out_dir=tmp_path / "whole", progress=False)
    pretrain(cfg, corpus["data"], corpus["tokenizer"], _recipe(), out_dir=tmp_path / "cut", progress=False,
             stop_after=10)
    resumed = pretrain(cfg, corpus["data"], corpus["tokenizer"], _recipe(), out_dir=tmp_path / "cut", resume=True,
                       progress=False)
    assert len(resumed.curves) == 20 and resumed.curves.step.tolist() == list(range(1, 21))
    np.testing.assert_allclose(resumed.curves.loss, whole.curves.loss, rtol=1e-5)
    for name, value in whole.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], value, rtol=1e-5, atol=1e-6)
    assert whole.curves.loss.iloc[-5:].mean() < whole.curves.loss.iloc[:5].mean()  # it learns
    probe = pd.read_csv(tmp_path / "whole" / "probe.csv")
    assert set(probe.step) == {10, 20} and set(probe.phase) == set(range(4))


def test_a_run_folder_loads_and_profiles_like_a_zoo_model(corpus, tmp_path):
    import phaseinterp as pi
    from phaseinterp.train.pretrain import pretrain

    pretrain(preset("tiny", d_vocab=1024), corpus["data"], corpus["tokenizer"], _recipe(steps=4),
             out_dir=tmp_path / "run", progress=False)
    model = pi.load(tmp_path / "run")
    assert model.metadata["task_type"] == "TextNeedle" and model.metadata["step"] == 4
    profile = pi.phase_profile(model, n_per_residue=64)
    assert len(profile.residue_accuracy) == 8 and profile.stride == 4 and 0 <= profile.to_dict()["mean"] <= 1
    from phaseinterp.cli import main  # in this process: the command is the same code, without an interpreter's start

    assert main(["profile", str(tmp_path / "run"), "--n-per-residue", "64", "--out", str(tmp_path / "p")]) == 0
    np.testing.assert_array_equal(pi.PhaseProfile.load(tmp_path / "p").records["correct"], profile.records["correct"])


@pytest.mark.slow
def test_one_and_two_processes_give_the_same_losses_and_a_two_process_checkpoint_resumes_on_one(corpus, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    first = _cli(*_pretrain_args(corpus, one))
    assert first.returncode == 0, first.stderr[-3000:]
    second = _cli(*_pretrain_args(corpus, two, "--nproc", "2", "--steps", "20"))
    assert second.returncode == 0, second.stderr[-3000:]
    a, b = pd.read_csv(one / "curves.csv"), pd.read_csv(two / "curves.csv")
    assert len(a) == len(b) == 20
    np.testing.assert_allclose(b.loss, a.loss, rtol=2e-3)
    assert (one / "curves.html").is_file()
    # stopped by 2 processes at step 10, resumed by 1
    cut = tmp_path / "cut"
    stop = _cli(*_pretrain_args(corpus, cut, "--nproc", "2", "--max-minutes", "1e-9"))
    assert stop.returncode == 0, stop.stderr[-3000:]
    state = json.loads(next((cut / "checkpoints").glob("step_*/train_state.json")).read_text())
    assert state["world_size"] == 2 and state["step"] == 1
    resumed = _cli(*_pretrain_args(corpus, cut, "--resume"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    c = pd.read_csv(cut / "curves.csv")
    np.testing.assert_allclose(c.loss, a.loss, rtol=2e-3)


# ------------------------------------------------------------------ bad inputs
@pytest.mark.slow
def test_bad_inputs_are_one_line_before_any_process_starts(corpus, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notok").mkdir()
    (tmp_path / "notok" / "vocab.txt").write_text("a folder, but no tokenizer.json")
    (tmp_path / "notext").mkdir()
    (tmp_path / "notext" / "weights.bin").write_bytes(b"\0")
    (tmp_path / "blank.txt").write_text("   \n\n")
    base = _pretrain_args(corpus, tmp_path / "run")

    def refused(args, match):
        result = _cli(*args, timeout=120)
        assert result.returncode == 2, (args, result.stderr[-2000:])
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and match in lines[0], (match, result.stderr)
        assert not (tmp_path / "run" / "checkpoints").exists()

    def swap(flag, value):
        args = list(base)
        args[args.index(flag) + 1] = value
        return args

    refused(swap("--data", str(tmp_path / "empty")), "is an empty folder")  # the readers' door
    refused(swap("--data", str(tmp_path / "notext")), "no text, JSONL or parquet files")
    refused(swap("--data", str(tmp_path / "blank.txt")), "holds no text")
    refused(swap("--tokenizer", str(tmp_path / "notok")), "has no tokenizer.json")
    refused(base + ["--nproc", "999"], "nproc=999 is more than this machine's")
    refused(swap("--seq-len", "66"), "seq_len=66 is not a multiple of the stride S=4")
    refused(base + ["--set", "d_vocab=100"], "d_vocab=100 is smaller than the tokenizer's vocabulary")
    small = tmp_path / "small-tok"
    from phaseinterp.train.tokenizer import train_tokenizer

    (tmp_path / "digits.txt").write_text("0123456789 " * 500)
    train_tokenizer(tmp_path / "digits.txt", 300, small, progress=False)
    refused(swap("--tokenizer", str(small)), "the needle task needs >= 32")
    # --resume with a changed setting names the field
    done = _cli(*_pretrain_args(corpus, tmp_path / "run2", "--steps", "2"))
    assert done.returncode == 0, done.stderr[-2000:]
    changed = _cli(*_pretrain_args(corpus, tmp_path / "run2", "--steps", "2", "--resume", "--set", "stride=2",
                                   "--set", "window=2"))
    assert changed.returncode == 2 and "another model (stride: 4 -> 2, window: 4 -> 2)" in changed.stderr
    lr = _cli(*_pretrain_args(corpus, tmp_path / "run2", "--steps", "2", "--resume", "--lr", "0.1"))
    assert lr.returncode == 2 and "another train (lr: 0.003 -> 0.1)" in lr.stderr
    again = _cli(*_pretrain_args(corpus, tmp_path / "run2", "--steps", "2"))
    assert again.returncode == 2 and "already holds a pretraining run" in again.stderr


# ------------------------------------------------------------------ the GPU recipe's numerics on CPU (issue 57)
@pytest.mark.slow
def test_two_processes_in_bf16_train_probe_checkpoint_and_resume(corpus, tmp_path):
    """The GPU recipe emulated here: 2 processes on gloo with FSDP2's bf16 policy (bf16 parameters, fp32
    reductions) under CPU autocast, from the command line, with the probe and a checkpoint every 10 steps;
    then the run is resumed from its step-10 checkpoint (as after a crash) and retakes steps 11-20 as
    before. Before the probe ran under the training's autocast, its first forward raised in attention
    (fp32 queries and keys, bf16 values)."""
    import safetensors.torch

    run = tmp_path / "bf16"
    first = _cli(*_pretrain_args(corpus, run, "--nproc", "2", "--bf16"))
    assert first.returncode == 0, first.stderr[-3000:]
    recorded = json.loads((run / "pretrain.json").read_text())["train"]
    assert recorded["bf16"] is True and recorded["cpu_bf16"] is True  # the precision is part of the recipe
    whole = pd.read_csv(run / "curves.csv")
    assert whole.step.tolist() == list(range(1, 21)) and np.isfinite(whole.loss).all()
    assert whole.loss.iloc[-5:].mean() < whole.loss.iloc[:5].mean()  # it learns in bf16
    assert whole.dropna(subset=["probe_mean"]).step.tolist() == [10, 20]
    probe = pd.read_csv(run / "probe.csv")
    assert set(probe.step) == {10, 20} and set(probe.phase) == set(range(4))
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_000010", "step_000020"]
    weights = safetensors.torch.load_file(run / "model.safetensors")
    assert {v.dtype for v in weights.values()} == {torch.float32}  # the sharded master weights stay fp32
    (run / "checkpoints" / "LATEST").write_text("step_000010")  # as if the run had stopped after step 10
    resumed = _cli(*_pretrain_args(corpus, run, "--nproc", "2", "--bf16", "--resume"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = pd.read_csv(run / "curves.csv")
    assert again.step.tolist() == list(range(1, 21))
    np.testing.assert_allclose(again.loss, whole.loss, rtol=1e-4)  # steps 11-20 retaken from the checkpoint
    np.testing.assert_allclose(again.probe_mean, whole.probe_mean, atol=1e-9)


def test_bf16_on_cpu_is_asked_for_and_old_runs_resume_in_fp32(tmp_path):
    """``bf16=True`` alone means CUDA only (every run recorded before ``cpu_bf16`` trained fp32 on CPU and
    resumes so); ``cpu_bf16`` adds CPU; a record without the newer fields resumes with their defaults."""
    from phaseinterp.train.pretrain import RUN_FILE, PretrainConfig, autocast_for, check_resume

    tc = PretrainConfig()
    assert tc.compute_dtype("cuda") == torch.bfloat16 and tc.compute_dtype("cpu") is None
    assert PretrainConfig(cpu_bf16=True).compute_dtype("cpu") == torch.bfloat16
    assert PretrainConfig(bf16=False).compute_dtype("cuda") is None
    assert not autocast_for(torch.device("cpu"), True)._enabled
    cpu = autocast_for(torch.device("cpu"), True, True)
    assert cpu._enabled and cpu.fast_dtype == torch.bfloat16
    with pytest.raises(UserInputError, match="cpu_bf16=True asks for bfloat16 on CPU too, but bf16=False"):
        PretrainConfig(bf16=False, cpu_bf16=True)
    old = {k: v for k, v in tc.to_dict().items() if k not in ("cpu_bf16", "force_fsdp")}  # recorded before them
    record = {"model": {}, "train": old, "data": {}, "tokenizer": {}}
    (tmp_path / RUN_FILE).write_text(json.dumps(record))
    check_resume(tmp_path, {**record, "train": tc.to_dict()})
    check_resume(tmp_path, {**record, "train": PretrainConfig(force_fsdp=True).to_dict()})  # an execution field
    with pytest.raises(UserInputError, match=r"another train \(cpu_bf16: False -> True\)"):
        check_resume(tmp_path, {**record, "train": PretrainConfig(cpu_bf16=True).to_dict()})


def test_bf16_parameters_without_autocast_keep_q_k_v_in_one_dtype():
    """FSDP2's bf16 parameters without autocast: RoPE's tables follow the activations' dtype, so q, k and v
    meet attention in bf16 (they were fp32, fp32, bf16: scaled_dot_product_attention raised)."""
    from phaseinterp.models import CompressedTransformer

    for config in (preset("tiny", compression=None), preset("tiny")):
        model = CompressedTransformer(config).eval()
        for parameter in model.parameters():  # what FSDP2's param_dtype casts: the parameters, not the buffers
            parameter.data = parameter.data.to(torch.bfloat16)
        assert model.blocks[0].attn.rope_cos.dtype == torch.float32
        with torch.no_grad():
            logits = model(torch.randint(0, 512, (2, 16)))
        assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all(), config.label


# ------------------------------------------------------------------ planning a run's memory (issue 57)
def _saved_bytes_per_row(config, seq_len, bf16):
    """What a real forward of the whole model and its loss saves for the backward per row (2 rows minus 1):
    every saved tensor's storage once, the parameters left out."""
    from phaseinterp.models import CompressedTransformer

    def saved(rows):
        torch.manual_seed(0)
        model = CompressedTransformer(config).train()
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        seen = {}

        def pack(t):
            storage = t.untyped_storage()
            if storage.data_ptr() not in params:
                seen.setdefault(storage.data_ptr(), storage.nbytes())
            return t

        tokens = torch.randint(0, config.d_vocab, (rows, seq_len + 1))
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
            logits = model(tokens[:, :-1])
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten(), reduction="sum")
        return sum(seen.values())

    return saved(2) - saved(1)


@pytest.mark.parametrize("compression", ["compressed", "full"])
def test_the_activation_estimate_matches_what_a_real_forward_saves(compression):
    """The plan measures one block at <= 512 tokens and extrapolates in length and depth; a real forward of
    the whole 4-layer model at 1,024 tokens saves the same bytes per row to 10%, in fp32 and in bf16."""
    from phaseinterp.train.plan import activation_bytes_per_row

    config = preset("cpu-small", n_ctx=1024, **({"compression": None} if compression == "full" else {}))
    for bf16 in (False, True):
        estimate = activation_bytes_per_row(config, 1024, dtype=torch.bfloat16 if bf16 else None)
        # the loss keeps the fp32 log-probabilities (4 bytes of the plan's 10 or 12 per logit: the rest is
        # their gradient and the logits, alive at the backward's start, not saved)
        predicted = estimate["layers"] + estimate["head"] + 1024 * config.d_vocab * 4
        measured = _saved_bytes_per_row(config, 1024, bf16)
        assert predicted == pytest.approx(measured, rel=0.10), (bf16, predicted / 2**20, measured / 2**20)
    checkpointed = activation_bytes_per_row(config, 1024, activation_checkpointing=True)
    assert checkpointed["layers"] < estimate["layers"] and checkpointed["logits"] > estimate["logits"]  # fp32 logits


def test_a_plan_names_the_memory_per_device_and_what_would_fit():
    from phaseinterp.train.plan import GIB, plan_memory
    from phaseinterp.train.pretrain import PretrainConfig

    config = preset("cpu-small", n_ctx=512)
    tc = PretrainConfig(seq_len=512, global_batch=8)
    roomy = plan_memory(config, tc, nproc=2, device_gib=8)
    assert roomy.fits and roomy.sharded and roomy.rows_per_device == 4 and roomy.micro_batch == 4
    assert set(roomy.per_device) == {"parameters", "gradients", "optimizer", "working copies", "activations", "logits"}
    n = roomy.parameters
    assert roomy.per_device["optimizer"] == 8 * n // 2 and roomy.per_device["parameters"] == 4 * n // 2
    assert roomy.per_device["activations"] == 4 * (roomy.per_row["layers"] + roomy.per_row["head"])
    one_row = roomy.per_row["layers"] + roomy.per_row["head"] + roomy.per_row["logits"]
    # a device that holds 2 rows per forward but not 4: the plan refuses and names --micro-batch 2
    tight = plan_memory(config, tc, nproc=2, device_gib=(roomy.total - 1.5 * one_row) / 0.9 / GIB)
    assert not tight.fits and "--micro-batch 2" in tight.advice and "global batch of 8" in tight.advice
    assert "does NOT fit" in tight.table() and "per row" in tight.table()
    hopeless = plan_memory(config, tc, nproc=2, device_gib=1e-4)
    assert not hopeless.fits and "does not fit: more processes" in hopeless.advice
    with pytest.raises(UserInputError, match="global_batch=8 is not divisible by nproc=3"):
        plan_memory(config, tc, nproc=3)


@pytest.mark.slow
def test_pretrain_plan_from_the_command_line_needs_no_data():
    """``pretrain --plan`` prints the per-device memory and the preset's recipe with no data, tokenizer or
    --out; a run that cannot fit exits 2 naming what would fit."""
    fits = _cli("pretrain", "--plan", "--preset", "cpu-small", "--seq-len", "256", "--global-batch", "8",
                "--nproc", "2", "--device-memory", "4", timeout=300)
    assert fits.returncode == 0, fits.stderr[-2000:]
    assert "per device:" in fits.stdout and ": fits" in fits.stdout and "activations" in fits.stdout
    big = _cli("pretrain", "--plan", "--preset", "qwen3-100m", "--seq-len", "512", "--global-batch", "16",
               "--nproc", "2", "--device-memory", "6", timeout=300)
    assert big.returncode == 2, big.stderr[-2000:]
    assert "lr 0.0006, warm-up 380 steps" in big.stdout  # the preset's recipe
    assert "does NOT fit" in big.stdout and "would fit with" in big.stderr and "--micro-batch" in big.stderr
    missing = _cli("pretrain", "--preset", "tiny", "--seq-len", "64", timeout=120)
    assert missing.returncode == 2 and "pretrain needs --data" in missing.stderr


def test_presets_carry_their_own_recipe():
    from phaseinterp.train.pretrain import PretrainConfig, preset_recipe

    big = PretrainConfig(**preset_recipe("qwen3-0.6b"))
    assert (big.lr, big.warmup_steps, big.global_batch, big.seq_len) == (3e-4, 380, 64, 2048)
    assert big.steps * big.global_batch * big.seq_len == pytest.approx(5e8, rel=0.001)  # the reproduction's budget
    assert PretrainConfig(**preset_recipe("qwen3-100m")).lr == 6e-4
    assert preset_recipe("cpu-small") == {} and preset_recipe("tiny") == {}  # the CPU defaults


# ------------------------------------------------------------------ gates and snapshots (issue 57)
def test_gate_parameters_and_the_embedding_are_not_weight_decayed():
    """AdamW decays the matrices but the embedding and every gate parameter (own kernel: Z_k, Z_v, b_k, b_v;
    DeepSeek's: gate_proj, position_bias): decay would pull each gate toward uniform. The synthetic-task
    recipe (`train`, which trained the zoo) decays them too."""
    from phaseinterp.models import CompressedTransformer
    from phaseinterp.train.pretrain import PretrainConfig
    from phaseinterp.train.recipe import adamw, decayed_parameter_names

    for config, gates in ((preset("tiny"), {"Z_k", "Z_v", "b_k", "b_v"}),
                          (preset("tiny", compression="deepseek", gate="vector"), {"gate_proj", "position_bias"})):
        model = CompressedTransformer(config)
        names = dict(model.named_parameters())
        decayed = set(decayed_parameter_names(model))
        assert {n for n in names if n.split(".")[-1] in gates} & decayed == set()
        assert {f"blocks.{i}.attn.compressor.{g}" for i in range(2) for g in gates} <= set(names)
        assert "W_E" not in decayed and {"blocks.0.attn.W_Q", "blocks.1.mlp.W_out"} <= decayed
        assert all(names[n].ndim >= 2 for n in decayed)
        if config.compression == "deepseek":
            assert "blocks.0.attn.compressor.kv_proj" in decayed  # the payload map is a matrix like the others
        groups = adamw(model, PretrainConfig(weight_decay=0.1)).param_groups
        assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
        assert {id(p) for p in groups[0]["params"]} == {id(names[n]) for n in decayed}
        with_gates = set(decayed_parameter_names(model, decay_gates=True))
        assert with_gates - decayed == {n for n in names if n.split(".")[-1] in gates and names[n].ndim >= 2}


def test_keep_every_keeps_the_snapshots_at_its_multiples(tmp_path):
    """Checkpoints every 100 steps with keep_every=300: the newest two and every multiple of 300 survive."""
    from phaseinterp.train.checkpoints import publish_checkpoint

    for keep_every, expected in ((300, [300, 600, 900, 1000]), (None, [900, 1000])):
        root = tmp_path / f"checkpoints-{keep_every}"
        root.mkdir()
        for step in range(100, 1001, 100):
            tmp = root / f".step_{step:06d}.tmp"
            tmp.mkdir()
            (tmp / "state").write_text(str(step))
            publish_checkpoint(root, tmp, f"step_{step:06d}", keep_every=keep_every)
        assert sorted(int(p.name[5:]) for p in root.glob("step_*")) == expected
        assert (root / "LATEST").read_text().strip() == "step_001000"


# ------------------------------------------------------------------ a portable token cache (issue 57)
def test_the_token_cache_is_keyed_on_content_so_a_copied_corpus_is_reused(corpus, tmp_path):
    """The cache and its corpus copied to another path (new mtimes) are reused, not re-tokenized; a cache
    written before the content key is adopted while its files are untouched; a run's record resumes on
    the copy; an edit rebuilds the cache."""
    import shutil

    from phaseinterp.train.corpus import MANIFEST, content_fingerprint, tokenize_corpus
    from phaseinterp.train.pretrain import RUN_FILE, PretrainConfig, check_resume
    from phaseinterp.train.tokenizer import TextTokenizer

    tok = TextTokenizer(corpus["tokenizer"])
    here = tmp_path / "here"
    here.mkdir()
    shutil.copy(corpus["data"], here / "topics.jsonl")
    first = tokenize_corpus(here / "topics.jsonl", tok, here / "cache", progress=False)
    assert first.manifest["content_sha256"] == content_fingerprint(corpus["data"])  # the same bytes and name
    there = tmp_path / "elsewhere" / "machine"
    shutil.copytree(here, there)  # new paths and mtimes
    stamp = (there / "cache" / "train.bin").stat().st_mtime_ns
    again = tokenize_corpus(there / "topics.jsonl", tok, there / "cache", progress=False)
    assert (there / "cache" / "train.bin").stat().st_mtime_ns == stamp  # reused
    assert again.manifest["source"] == str((there / "topics.jsonl").resolve())
    assert np.array_equal(again.tokens("train"), first.tokens("train"))
    # a cache from before the content key: adopted (hashed once) while the files are the ones it names
    manifest = json.loads((here / "cache" / MANIFEST).read_text())
    del manifest["content_sha256"]
    (here / "cache" / MANIFEST).write_text(json.dumps(manifest))
    stamp = (here / "cache" / "train.bin").stat().st_mtime_ns
    adopted = tokenize_corpus(here / "topics.jsonl", tok, here / "cache", progress=False)
    assert adopted.manifest["content_sha256"] == first.manifest["content_sha256"]
    assert (here / "cache" / "train.bin").stat().st_mtime_ns == stamp
    # the run's record: a resume on the copy is the same data; other content is not
    record = {"model": {}, "train": PretrainConfig().to_dict(), "data": {"source": str(here / "topics.jsonl"), "fingerprint": "a",
                                                 "content_sha256": first.manifest["content_sha256"]},
              "tokenizer": {"folder": "/somewhere/else", "sha256": tok.sha256}}
    (tmp_path / RUN_FILE).write_text(json.dumps(record))
    moved = {**record, "data": {"source": str(there / "topics.jsonl"), "fingerprint": "b",
                                "content_sha256": again.manifest["content_sha256"]},
             "tokenizer": {"folder": str(corpus["tokenizer"]), "sha256": tok.sha256}}
    check_resume(tmp_path, moved)
    with pytest.raises(UserInputError, match="another data"):
        check_resume(tmp_path, {**moved, "data": {**moved["data"], "content_sha256": "0" * 64}})
    # one word changed: another content key, and the cache is rebuilt
    path = there / "topics.jsonl"
    path.write_text(path.read_text().replace(" the ", " teh ", 1))
    edited = tokenize_corpus(path, tok, there / "cache", progress=False)
    assert (there / "cache" / "train.bin").stat().st_mtime_ns != stamp
    assert edited.manifest["content_sha256"] != first.manifest["content_sha256"]


def test_a_run_stopped_while_it_tokenized_is_resumable_and_a_data_folder_is_not(tmp_path):
    """A pretraining run interrupted before its run file is written holds only its token cache
    (``out/data``): that folder is the run's (resumed with ``resume=True``), while a folder whose ``data``
    holds anything else (a user's corpus) is never taken for one."""
    from phaseinterp._files import check_write_target, saved_kind

    stopped = tmp_path / "stopped" / "data"
    stopped.mkdir(parents=True)
    for name in ("train.bin", ".heldout.bin.tmp"):
        (stopped / name).write_bytes(b"\0" * 8)
    assert saved_kind(stopped.parent) == "pretraining run"
    assert check_write_target(stopped.parent, "pretraining run", overwrite=True) == stopped.parent
    with pytest.raises(UserInputError, match="already holds a pretraining run"):
        check_write_target(stopped.parent, "pretraining run")
    corpus = tmp_path / "project" / "data"
    corpus.mkdir(parents=True)
    (corpus / "train.bin").write_bytes(b"\0")
    (corpus / "notes.txt").write_text("mine")
    assert saved_kind(corpus.parent) == "other files"
    with pytest.raises(UserInputError, match="holds no saved pretraining run"):
        check_write_target(corpus.parent, "pretraining run", overwrite=True)
