"""lm-evaluation-harness interop (`phaseinterp.engines.lm_eval`): the written task folder, the logged samples read
back as a `PhaseProfile`, the zoo folders' tokenizers, and (slow) lm-eval's hf backend against
`phase_profile` prompt by prompt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from phaseinterp import CompressedConfig, CompressedTransformer
from phaseinterp.engines.lm_eval import profile_from_lm_eval
from phaseinterp.errors import UserInputError
from phaseinterp.tasks import KeyValueRetrieval

ROOT = Path(__file__).resolve().parents[1]
TASK = KeyValueRetrieval(seq_len=64, n_records=8, n_demos=2, min_distance=20, residue_modulus=8)
CFG = CompressedConfig(d_vocab=TASK.vocab.size, n_ctx=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                       d_head=16, d_mlp=64, window=4, stride=4, local_window=8)
N = 23  # prompts per residue: 184 prompts, a few seconds to write
NAME = "phaseinterp_small"


@pytest.fixture(scope="module")
def model():
    m = CompressedTransformer(CFG)
    m.metadata.update(task=TASK.to_dict(), task_type="KeyValueRetrieval")
    return m.eval()


@pytest.fixture(scope="module")
def task_dir(model, tmp_path_factory):
    from phaseinterp.engines.lm_eval import write_lm_eval_task

    return write_lm_eval_task(model, tmp_path_factory.mktemp("lm_eval") / "task", n_per_residue=N, seed=3,
                              name=NAME)


def _yaml(path: Path) -> dict:
    """The task YAML as lm-eval reads it, with ``!function module.name`` kept as that string."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: "!function " + loader.construct_scalar(node))
    return yaml.load(path.read_text(), Loader=Loader)


def _docs(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "prompts.jsonl").read_text().splitlines()]


def test_the_written_yaml_parses_and_the_prompts_are_the_task_batch(task_dir):
    """The YAML is a loglikelihood task with acc over the prompts.jsonl documents; each document holds its
    prompt's ids up to answer_pos, answer, residue, phase and the task's metadata row, in batch order."""
    assert sorted(p.name for p in task_dir.iterdir()) == ["lm_eval_task.json", f"{NAME}.yaml", "prompts.jsonl",
                                                          "prompts.py"]
    config = _yaml(task_dir / f"{NAME}.yaml")
    assert config["task"] == NAME and config["output_type"] == "loglikelihood"
    assert config["custom_dataset"] == "!function prompts.load" and config["test_split"] == "test"
    assert [m["metric"] for m in config["metric_list"]] == ["acc"]
    assert (config["doc_to_text"], config["doc_to_target"]) == ("context", "continuation")

    batch = TASK.generate(N, seed=3)
    docs = _docs(task_dir)
    assert len(docs) == len(batch) == N * TASK.residue_modulus
    for i, doc in enumerate(docs):
        pos = int(batch.answer_pos[i])
        assert doc["prompt_index"] == i and doc["answer_pos"] == pos
        assert doc["tokens"] == batch.tokens[i, : pos + 1].tolist()
        assert doc["answer"] == int(batch.answer[i])
        assert doc["residue"] == int(batch.meta["residue"][i]) and doc["phase"] == doc["residue"] % CFG.stride
        assert doc["target_pos"] == int(batch.meta["target_pos"][i])
        assert doc["mapping_id"] == int(batch.meta["mapping_id"][i])
        assert (doc["residue_modulus"], doc["stride"], doc["n_prompts"]) == (8, 4, len(batch))
        assert doc["context"] == " ".join(TASK.vocab.tokens[t] for t in doc["tokens"])
        assert doc["continuation"] == " " + TASK.vocab.tokens[doc["answer"]]
    manifest = json.loads((task_dir / "lm_eval_task.json").read_text())
    assert (manifest["task_name"], manifest["n_per_residue"], manifest["seed"]) == (NAME, N, 3)


def test_the_prompt_text_encodes_back_to_the_prompt_ids(task_dir, tmp_path):
    """The vocabulary's Hugging Face tokenizer (what the zoo's HF folders ship) maps context + continuation,
    as lm-eval concatenates them, to exactly the prompt's ids and the answer, with no added token."""
    pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from phaseinterp.tasks.hf_tokenizer import write_vocab_tokenizer

    write_vocab_tokenizer(TASK.vocab, tmp_path, 64)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert len(tokenizer) == TASK.vocab.size and tokenizer.bos_token_id == TASK.vocab.bos_id
    for doc in _docs(task_dir)[:: 7]:
        assert tokenizer(doc["context"] + doc["continuation"]).input_ids == doc["tokens"] + [doc["answer"]]
        assert tokenizer(doc["context"], add_special_tokens=True).input_ids == doc["tokens"]
    with pytest.raises(Exception, match="UNK"):  # a word outside the vocabulary is an error, never a substitute
        tokenizer("the zebra")


def test_lm_eval_reads_the_folder_into_the_same_requests(task_dir):
    """lm-eval's own task loader (no model) builds one loglikelihood request per prompt: (context,
    " answer"), in prompt order."""
    pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    task = TaskManager(include_path=str(task_dir), include_defaults=False).load([NAME])["tasks"][NAME]
    task.build_all_requests(limit=None, rank=0, world_size=1)
    docs = _docs(task_dir)
    requests = sorted(task.instances, key=lambda r: r.doc_id)
    assert [r.request_type for r in requests] == ["loglikelihood"] * len(docs)
    assert [r.args for r in requests] == [(d["context"], d["continuation"]) for d in docs]


def _samples(task_dir: Path, out: Path, correct, *, task: str = NAME, model: str = "some/model-dir",
             date: str = "2026-01-02T03-04-05.678901", docs=None) -> Path:
    """A hand-made lm-eval output folder: OUT/<model sanitized>/samples_<task>_<date>.jsonl (+ results)."""
    docs = _docs(task_dir) if docs is None else docs
    folder = out / model.replace("/", "__")
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (doc, ok) in enumerate(zip(docs, correct)):
        ll = -0.1 if ok else -3.0
        lines.append(json.dumps({"doc_id": i, "doc": doc, "target": doc.get("continuation"),
                                 "arguments": {"gen_args_0": {"arg_0": doc.get("context"), "arg_1": "x"}},
                                 "resps": [[[str(ll), str(bool(ok))]]], "filtered_resps": [[str(ll), str(bool(ok))]],
                                 "filter": "none", "metrics": ["acc"], "acc": int(ok)}))
    path = folder / f"samples_{task}_{date}.jsonl"
    path.write_text("\n".join(reversed(lines)) + "\n")  # order of the file is not the prompts' order
    (folder / f"results_{date}.json").write_text(json.dumps({"model_name": model}))
    return path


def test_from_lm_eval_round_trips_hand_made_samples(task_dir, tmp_path):
    """Samples logged by lm-eval become the profile profile_from_records gives on the same correctness:
    residues, phases, counts, intervals; the records keep the task's metadata, sorted by prompt."""
    from phaseinterp.profile import profile_from_records

    docs = _docs(task_dir)
    rng = np.random.default_rng(0)
    correct = [bool(rng.random() < (0.9 if d["phase"] != 3 else 0.2)) for d in docs]
    _samples(task_dir, tmp_path / "out", correct)
    profile = profile_from_lm_eval(tmp_path / "out", n_permutations=99)
    assert profile.label == f"model-dir (lm-eval {NAME})"
    assert (profile.modulus, profile.stride, len(profile.records)) == (8, 4, len(docs))
    assert profile.records["prompt_index"].tolist() == list(range(len(docs)))
    assert profile.records["correct"].tolist() == correct
    assert profile.records["residue"].tolist() == [d["residue"] for d in docs]
    assert {"mapping_id", "target_pos", "phase", "answer", "answer_logprob"} <= set(profile.records)
    assert not {"context", "tokens"} & set(profile.records)
    import pandas as pd

    expected = profile_from_records(pd.DataFrame({"residue": [d["residue"] for d in docs], "correct": correct,
                                                  "mapping_id": [d["mapping_id"] for d in docs]}),
                                    8, 4, n_permutations=99)
    np.testing.assert_array_equal(profile.residue_correct, expected.residue_correct)
    np.testing.assert_allclose(profile.phase_accuracy, expected.phase_accuracy)
    np.testing.assert_allclose(profile.residue_lower, expected.residue_lower)
    assert profile.interval_method == expected.interval_method
    # the samples file itself, and a task name, work too
    same = profile_from_lm_eval(next((tmp_path / "out").rglob("samples_*.jsonl")), task_name=NAME,
                                     n_permutations=99)
    np.testing.assert_array_equal(same.residue_correct, profile.residue_correct)


def _one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and isinstance(err.value, UserInputError), text
    return text


def test_from_lm_eval_bad_inputs_each_give_one_line(task_dir, tmp_path):

    with pytest.raises(UserInputError) as err:
        profile_from_lm_eval(tmp_path / "missing")
    assert "does not exist" in _one_line(err) and "missing" in str(err.value)
    assert isinstance(err.value, FileNotFoundError)

    empty = tmp_path / "no_samples" / "org__model"
    empty.mkdir(parents=True)
    (empty / "results_2026-01-02T03-04-05.678901.json").write_text("{}")
    with pytest.raises(UserInputError) as err:
        profile_from_lm_eval(tmp_path / "no_samples")
    assert "--log_samples" in _one_line(err) and "no_samples" in str(err.value)

    other = tmp_path / "other"
    hellaswag = [{"query": "a", "choices": ["b"], "gold": 0}] * 3
    _samples(task_dir, other, [True] * 3, task="hellaswag", docs=hellaswag)
    with pytest.raises(UserInputError) as err:  # expected task named
        profile_from_lm_eval(other, task_name=NAME)
    text = _one_line(err)
    assert "'hellaswag'" in text and repr(NAME) in text
    with pytest.raises(UserInputError) as err:  # no name: not a phaseinterp task
        profile_from_lm_eval(other)
    assert "'hellaswag'" in _one_line(err) and "phaseinterp lm-eval-task" in str(err.value)

    ours = tmp_path / "ours"
    _samples(task_dir, ours, [True] * len(_docs(task_dir)))
    with pytest.raises(UserInputError) as err:  # ours is there, the name asked for is not
        profile_from_lm_eval(ours, task_name="phaseinterp_other")
    assert repr(NAME) in _one_line(err) and "'phaseinterp_other'" in str(err.value)

    partial = tmp_path / "partial"
    _samples(task_dir, partial, [True] * 10, docs=_docs(task_dir)[:10])
    with pytest.raises(UserInputError) as err:  # lm_eval --limit 10
        profile_from_lm_eval(partial)
    assert "10 of the task's 184 prompts" in _one_line(err)

    twice = tmp_path / "twice"
    _samples(task_dir, twice, [True] * 184)
    _samples(task_dir, twice, [True] * 184, date="2026-01-03T03-04-05.678901")
    with pytest.raises(UserInputError) as err:  # two runs: which one is not guessed
        profile_from_lm_eval(twice)
    assert "2 samples files" in _one_line(err)


def test_write_refuses_bad_settings_before_writing(model, tmp_path):
    from phaseinterp.engines.lm_eval import write_lm_eval_task

    for kwargs, match in (({"name": "has-dash"}, "name='has-dash'"), ({"n_per_residue": 0}, "n_per_residue"),
                          ({"seed": -1}, "seed")):
        with pytest.raises(UserInputError, match=match):
            write_lm_eval_task(model, tmp_path / "t", **kwargs)
    assert not (tmp_path / "t").exists()


@pytest.mark.zoo("dsv4-tiny", "dsv4.1-tiny", "dsv4-tiny-fp8")
def test_the_zoo_hf_folders_ship_their_vocabulary_tokenizer(tmp_path):
    """dsv4-tiny, dsv4.1-tiny and dsv4-tiny-fp8 load with AutoTokenizer: id i is the stored task's token i; the
    shipped files are what `zoo build` writes now (`write_tokenizer`, byte for byte)."""
    transformers = pytest.importorskip("transformers")
    import shutil

    from phaseinterp.tasks import task_from_dict
    from phaseinterp.zoo import deepseek_v4 as hf_zoo

    for name in ("dsv4-tiny", "dsv4.1-tiny", "dsv4-tiny-fp8"):
        folder = hf_zoo.CHECKPOINT_DIR / name
        vocab = task_from_dict(json.loads((folder / "phaseinterp.json").read_text())["metadata"]["task"]).vocab
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        assert tokenizer.convert_ids_to_tokens(list(range(vocab.size))) == list(vocab.tokens)
        copy = tmp_path / name
        shutil.copytree(folder, copy)
        hf_zoo.write_tokenizer(copy)
        for file in ("tokenizer.json", "tokenizer_config.json"):
            assert (copy / file).read_bytes() == (folder / file).read_bytes(), (name, file)


@pytest.mark.slow  # lm-eval's hf backend in a fresh process: ~1 min on two CPU cores
@pytest.mark.zoo("dsv4-tiny")
def test_lm_eval_hf_backend_agrees_with_phase_profile_prompt_by_prompt(tmp_path):
    """`lm_eval --model hf` (offline) on the written task of the shipped dsv4-tiny folder, read back with
    profile_from_lm_eval, has phase_profile's correctness on every prompt (same prompts, same top-1
    rule), and transformers' own answer log-probs to float32 rounding. (phaseinterp's log-probs differ
    where the indexer's top-k chooses among exactly tied entries, which transformers' ``topk`` orders
    by its own rule: such ties are not part of the model, docs/models.md; `check_against_transformers`
    holds the two models equal with one selection, and its rows apart must be 0 on these prompts.)"""
    pytest.importorskip("lm_eval")
    pytest.importorskip("transformers")
    import phaseinterp
    from phaseinterp.engines.lm_eval import write_lm_eval_task
    from phaseinterp.models.hf.against_hf import check_against_transformers
    from phaseinterp.zoo import deepseek_v4 as hf_zoo

    n = 72  # the smallest size the zoo task moment-matches (1,728 prompts)
    task_dir = write_lm_eval_task("dsv4-tiny", tmp_path / "task", n_per_residue=n)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "datasets"), "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
               f"pretrained={hf_zoo.CHECKPOINT_DIR / 'dsv4-tiny'},dtype=float32", "--device", "cpu",
               "--batch_size", "64", "--include_path", str(task_dir), "--tasks", "phaseinterp_dsv4_tiny",
               "--log_samples", "--output_path", str(tmp_path / "out")]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    from_lm_eval = profile_from_lm_eval(tmp_path / "out")
    here = phaseinterp.phase_profile(phaseinterp.load("dsv4-tiny"), n_per_residue=n, progress=False)
    assert len(from_lm_eval.records) == len(here.records) == n * 24
    for column in ("residue", "target_pos", "mapping_id", "answer"):
        np.testing.assert_array_equal(from_lm_eval.records[column], here.records[column])
    mismatched = np.flatnonzero(from_lm_eval.records["correct"].to_numpy() != here.records["correct"].to_numpy())
    assert mismatched.size == 0, f"prompts {mismatched[:10].tolist()} differ"
    model = phaseinterp.load("dsv4-tiny")
    batch = phaseinterp.zoo.task_for(model).generate(n, seed=0)
    np.testing.assert_array_equal(batch.answer.numpy(), here.records["answer"].to_numpy())
    with torch.inference_mode():
        theirs = torch.cat([model.hf(batch.tokens[i:i + 128], use_cache=False).logits[:, -1].log_softmax(-1)
                            for i in range(0, len(batch.tokens), 128)])
    assert (batch.answer_pos == batch.tokens.shape[1] - 1).all()
    transformers_logprob = theirs.gather(1, batch.answer[:, None])[:, 0].numpy()
    np.testing.assert_allclose(from_lm_eval.records["answer_logprob"], transformers_logprob, atol=1e-4)
    check = check_against_transformers(model, batch.tokens[:256])
    assert check.rows_apart == 0 and check.max_abs_diff < 1e-4, check
    np.testing.assert_array_equal(from_lm_eval.residue_correct, here.residue_correct)
    assert from_lm_eval.period == here.period
