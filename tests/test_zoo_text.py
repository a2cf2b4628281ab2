"""The natural-text zoo models (issue 57): a 2-layer W = S = 4 model and its full-attention twin pretrained
on Python source to 49.2M tokens, shipped with their tokenizer and their task (identifier recall in the
run's held-out code). Loading and the task's storage here; the phase claim and every experiment on them
in the slow tier."""

from __future__ import annotations

import json

import numpy as np
import pytest

import phaseinterp as pi
from phaseinterp import zoo
from phaseinterp.errors import UserInputError
from phaseinterp.tasks import IdentifierRecall, task_from_dict
from phaseinterp.tasks._serialize import pack_tokens, unpack_tokens
from phaseinterp.train import TextTokenizer

TEXT = ("py-w4s4", "py-full", "py-w8s8")


@pytest.mark.zoo(*TEXT)
@pytest.mark.parametrize("name", TEXT)
def test_a_natural_text_model_loads_with_its_tokenizer_and_task(zoo_model, name):
    model = zoo_model(name)
    assert name in zoo.available() and name in {row[0] for row in zoo.catalog()}
    task = zoo.task_for(model)
    assert isinstance(task, IdentifierRecall) and task.seq_len == 256 and task.residue_modulus == 24
    assert len(task.text) == 1_047_702  # the run's whole held-out split
    tok = TextTokenizer(zoo.CHECKPOINT_DIR / name / "tokenizer")
    assert len(task.token_text) == tok.vocab_size == model.cfg.d_vocab
    assert all(task.token_text[i] == tok.decode([i]) for i in (300, 1000, 4000))
    assert model.metadata["zoo_name"] == name and model.metadata["step"] == 24000
    assert (model.cfg.compression is None) == (name == "py-full")
    assert model.cfg.n_layers == 2


def test_natural_text_models_are_not_built_by_the_zoo_recipe():
    with pytest.raises(UserInputError, match="pretrained on natural text.*pretrain_python_code.py install"):
        zoo.entry("py-w4s4")
    with pytest.raises(UserInputError, match="not a natural-text zoo model|did you mean"):
        zoo.install_text("py-w16s16", "/nonexistent", "/nonexistent")


@pytest.mark.parametrize("ids", [[], [0, 1, 65535], [0, 70000, 3], list(range(5000))])
def test_token_lists_are_stored_packed_and_read_back(ids):
    packed = json.loads(json.dumps(pack_tokens(ids)))
    assert packed["dtype"] == ("uint32" if ids and max(ids) >= 2**16 else "uint16")
    assert unpack_tokens(packed) == tuple(ids)
    assert unpack_tokens(ids) == tuple(ids)  # a plain list, as files written before packing hold


def test_a_damaged_token_list_is_refused_by_name():
    packed = pack_tokens([1, 2, 3])
    with pytest.raises(UserInputError, match="text: the stored token list holds 3 ids, its header says 4"):
        unpack_tokens({**packed, "n": 4})
    with pytest.raises(UserInputError, match="text: not a stored token list"):
        unpack_tokens({**packed, "zlib_base64": "not base64!"})
    with pytest.raises(UserInputError, match="must lie in 0"):
        pack_tokens([-1])


def test_identifier_recall_round_trips_through_json_packed():
    rng = np.random.default_rng(0)
    names = ["def", " f", "(", "x", ")", ":", " return", " x", "\n", "a", "b"]
    text = tuple(int(t) for t in rng.integers(0, len(names), 4000))
    task = IdentifierRecall(text=text, token_text=tuple(names))
    stored = json.loads(json.dumps(task.to_dict()))
    assert isinstance(stored["text"], dict) and stored["text"]["n"] == 4000
    assert task_from_dict(stored) == task
    legacy = {**stored, "text": list(text)}  # the plain-list form older checkpoints hold
    assert IdentifierRecall.from_dict(legacy) == task


# ------------------------------------------------------------------ the claim on the shipped pair
@pytest.mark.slow
@pytest.mark.zoo(*TEXT)
def test_identifier_recall_is_periodic_with_compression_and_flat_without(zoo_profile):
    """RESULTS "Natural text", probe 2 at the budget (seed 0), as `phase_profile` measures it on the shipped
    pair with the default size (72 per residue, 1,728 prompts). Refuted if the compressed model is flat (no
    period 4 or a phase gap < 10 pp), if its worst and best phase intervals overlap, or if the twin shows a
    period or a gap >= 10 pp."""
    compressed, full = zoo_profile("py-w4s4", 72), zoo_profile("py-full", 72)
    assert compressed.period == 4 and compressed.phase_gap >= 0.10
    assert compressed.phase_upper[compressed.worst_phases[0]] < compressed.phase_lower[compressed.best_phase]
    assert full.period is None and not full.period_undetermined
    assert full.phase_gap < 0.10
    assert np.mean(full.phase_accuracy) > np.mean(compressed.phase_accuracy) + 0.10


@pytest.mark.slow
@pytest.mark.zoo("py-w8s8", "py-full")
def test_the_w8s8_arm_does_not_show_its_stride(zoo_profile):
    """RESULTS "Natural text", the W = S = 8 arm at the budget: the expectation stated before its run ended
    (period 8, as w4s4 shows period 4) is NOT met. py-w8s8 recalls identifiers flat (no significant
    period) and far below its twin. A snapshot of that null: it fails if a rebuilt py-w8s8 shows a period,
    or reaches within 20 pp of the twin's mean, and RESULTS must then change."""
    compressed, full = zoo_profile("py-w8s8", 72), zoo_profile("py-full", 72)
    assert compressed.stride == 8
    assert compressed.period is None and not compressed.period_undetermined
    assert np.mean(full.phase_accuracy) > np.mean(compressed.phase_accuracy) + 0.20


@pytest.mark.slow
@pytest.mark.zoo("py-w4s4", "py-w8s8")
@pytest.mark.parametrize("name", ["py-w4s4", "py-w8s8"])
def test_every_experiment_runs_on_a_natural_text_model(zoo_model, zoo_profile, name):
    model = zoo_model(name)
    ablation = pi.ablate(model, layer=1, n_per_residue=72, progress=False)
    assert not ablation.premise_notes and len(ablation.to_frame())
    gates = pi.gate_profile(model, n_per_residue=8)
    assert not gates.premise_notes
    cycling = pi.gate_cycling_profile(model, layers=1, n_per_residue=72, progress=False,
                                      baseline=zoo_profile(name, 72))
    assert np.isfinite(cycling.summary()["value"]["corr2_pooled"])
