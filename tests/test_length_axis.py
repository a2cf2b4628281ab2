"""The prompt-length axis: phase_profile(axis="length" | "both") tells a model's phase sensitivity
(it follows the target) from an engine's length bug (it follows the prompt's length)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from jaxtyping import install_import_hook

with install_import_hook("phaseinterp.tasks.length_axis", "typecheck.typecheck"):
    from phaseinterp.tasks.length_axis import length_axis_batch

import phaseinterp as pi
from phaseinterp.cli import main
from phaseinterp.engines import CacheEngine, engine_profile
from phaseinterp.errors import UserInputError
from phaseinterp.profile import PhaseProfile, TwoAxisProfile, phase_profile
from phaseinterp.tasks import KeyValueRetrieval

# Long enough that the length residues mod R = 24 fit (the prompts are laid out 23 tokens shorter).
LONG = KeyValueRetrieval(seq_len=192, n_records=40)


class OracleEngine:
    """Answers a key-value prompt right (the token after the query key's record) unless its length is
    3 mod 4: a stand-in for an engine whose bug is keyed to the prompt's length."""

    name = "oracle-with-a-length-bug"

    def __init__(self, d_vocab: int, bad_length_mod4: int | None = 3):
        self.d_vocab, self.bad = d_vocab, bad_length_mod4

    def __call__(self, tokens):
        out = torch.full((tokens.shape[0], self.d_vocab), -30.0)
        for i, row in enumerate(tokens.tolist()):
            key = row[-1]
            value = row[row.index(key) + 1]  # the record's value follows the key's first occurrence
            if self.bad is not None and len(row) % 4 == self.bad:
                value = (value + 1) % self.d_vocab
            out[i, value] = 0.0
        return torch.log_softmax(out, dim=-1)


@pytest.fixture(scope="module")
def w4s4():
    return pi.load("w4s4")


def test_a_length_bug_shows_on_the_length_axis_and_not_on_the_target_axis():
    engine = OracleEngine(LONG.vocab.size)
    length = engine_profile(engine, LONG, n_per_residue=48, stride=4, axis="length", progress=False)
    assert length.axis == "length" and length.modulus == 24
    acc = length.residue_accuracy
    lengths = np.arange(24)
    np.testing.assert_array_equal(acc[lengths % 4 == 3], 0.0)
    np.testing.assert_array_equal(acc[lengths % 4 != 3], 1.0)
    assert length.period == 4 and length.period_p_value < 0.01
    target = engine_profile(engine, LONG, n_per_residue=48, stride=4, progress=False)
    assert target.axis == "target" and target.period is None  # 192 = 0 mod 4: every target phase answered right
    np.testing.assert_array_equal(target.residue_accuracy, 1.0)


@pytest.fixture(scope="module")
def dsv4():
    return pi.load("dsv4-tiny")


def shrunk(model):
    """The model's zoo task shrunk to 64 tokens and R = 8 (24 prompts per residue moment-match on both axes):
    what a test of the code path needs, not the claim's size."""
    return dataclasses.replace(pi.zoo.task_for(model), seq_len=64, n_records=12, n_demos=2, residue_modulus=8,
                               min_distance=20)


@pytest.mark.slow  # a claim about the shipped w4s4 at the zoo task's size; the fast tier runs the axes on it below
def test_w4s4_follows_the_target_not_the_length(w4s4):
    task = pi.zoo.task_for(w4s4)
    target = phase_profile(w4s4, task, n_per_residue=96, progress=False)
    assert target.period == 4
    length = phase_profile(w4s4, task, n_per_residue=96, axis="length", hold=1, progress=False)
    assert length.modulus == 12  # the zoo task (T = 128 = n_ctx) lays out 11 tokens shorter, not 23
    # flat: no period, and a phase gap under a twentieth of the target axis's (0.95): a few prompts of 384
    # per length phase, at the weakest of the three strong target phases held
    assert target.phase_gap > 0.9
    assert length.period is None and length.phase_gap < 0.05, length.summary()
    both = phase_profile(w4s4, task, n_per_residue=72, axis="both", progress=False)
    assert isinstance(both, TwoAxisProfile)
    assert both.target.period == 4 and both.length.period is None and both.length.phase_gap < 0.05
    table = both.table().to_numpy()
    assert table[3].max() < 0.2 and table[:3].min() > 0.9  # the weak target phase 3 is weak at every length


def test_length_axis_prompts_hold_the_target_and_the_distance_moments():
    batch = length_axis_batch(LONG, 48, seed=0, stride=4, axis="length", hold=5)
    meta = batch.meta
    assert batch.residue_modulus == 24 and len(batch) == 48 * 24
    assert (meta["target_residue"] == 5).all()
    np.testing.assert_array_equal(meta["residue"], meta["prompt_len"] % 24)
    assert set(meta["prompt_len"]) == set(range(192 - 23, 193))
    distance = meta["prompt_len"] - 1 - meta["target_pos"]
    by = distance.groupby(meta["residue"])
    assert by.mean().max() - by.mean().min() <= 0.5
    assert by.std(ddof=0).max() / by.std(ddof=0).min() - 1 <= 0.01
    # every prompt is its shortened original with filler inserted after <bos>: the rest unchanged
    short = KeyValueRetrieval(seq_len=192 - 23, n_records=40).generate(48, seed=0)
    for i in (0, 500, len(batch) - 1):
        d, mapping = int(meta["shift"][i]), int(meta["mapping_id"][i])
        j = int(np.flatnonzero(short.meta["mapping_id"] == mapping)[0])
        row, orig = batch.tokens[i].tolist(), short.tokens[j].tolist()
        assert row[0] == orig[0] and row[1 + d: 169 + d] == orig[1:]
        assert set(row[1:1 + d]) <= set(LONG.vocab.filler_ids)
        assert int(batch.answer_pos[i]) == 168 + d and int(batch.answer[i]) == int(short.answer[j])


def test_both_axes_cover_every_cell_equally():
    batch = length_axis_batch(LONG, 24 + 8, seed=1, stride=4, axis="both")
    cells = batch.meta.groupby([batch.meta["target_residue"] % 4, batch.meta["length_residue"] % 4]).size()
    assert len(cells) == 16 and cells.nunique() == 1


def test_engine_and_in_process_agree_on_the_length_axis(w4s4):
    task = pi.zoo.task_for(w4s4)
    here = phase_profile(w4s4, task, n_per_residue=72, axis="length", progress=False)
    served = engine_profile(CacheEngine(w4s4), task, n_per_residue=72, stride=4, axis="length", progress=False,
                           label=here.label)
    np.testing.assert_array_equal(here.records["correct"], served.records["correct"])
    np.testing.assert_array_equal(here.residue_accuracy, served.residue_accuracy)


def test_axis_results_round_trip(tmp_path, w4s4):
    task = shrunk(w4s4)
    length = phase_profile(w4s4, task, n_per_residue=24, axis="length", progress=False)
    assert PhaseProfile.load(length.save(tmp_path / "l")).axis == "length"
    both = phase_profile(w4s4, task, n_per_residue=24, axis="both", progress=False)
    back = TwoAxisProfile.load(both.save(tmp_path / "b"))
    assert back == both and back.to_dict()["length_period"] is None
    assert back.plot().data[0].type == "heatmap" and "prompt-length" in length.plot().layout.xaxis.title.text


@pytest.mark.parametrize("kwargs, words", [
    (dict(axis="foo"), ["axis='foo'", "'target', 'length', 'both'"]),
    (dict(hold=2), ["hold=", "axis='length' only"]),
    (dict(axis="both", length_modulus=8), ["length_modulus=", "axis='length' only"]),
    (dict(axis="length", hold=24), ["hold=24", "0..23"]),
    (dict(axis="length", length_modulus=6), ["length_modulus=6", "[4, 8, 12, 24]"]),
    (dict(axis="length", length_modulus=24), ["23 tokens shorter"]),
])
def test_bad_axis_options_are_one_line_each(w4s4, kwargs, words):
    with pytest.raises(UserInputError) as err:
        phase_profile(w4s4, pi.zoo.task_for(w4s4), n_per_residue=72, progress=False, **kwargs)
    message = str(err.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_a_ready_batch_has_no_length_axis(w4s4):
    batch = pi.zoo.task_for(w4s4).generate(72)
    with pytest.raises(UserInputError, match="ready TaskBatch has one layout"):
        phase_profile(w4s4, batch, axis="length", progress=False)


def test_cli_axis(tmp_path, capsys):
    assert main(["profile", "w4s4", "--axis", "length", "--n-per-residue", "96", "--out", str(tmp_path / "p")]) == 0
    assert PhaseProfile.load(tmp_path / "p").modulus == 12
    assert main(["profile", "w4s4", "--hold", "1", "--out", str(tmp_path / "q")]) == 2
    assert "--hold applies to --axis length only" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()


def test_the_hugging_face_family_runs_both_axes_prompt_by_prompt(dsv4):
    """dsv4-tiny (transformers' DeepSeek-V4) on both axes: every (target phase, length phase) cell, and each
    prompt's prediction in the padded batch is that prompt's own forward at its answer position."""
    task = shrunk(dsv4)
    spec = pi.ProfileSpec(n_per_residue=24, axis="both", progress=False)
    both = phase_profile(dsv4, task, spec=spec)
    assert isinstance(both, TwoAxisProfile) and both.target.modulus == 8 and both.length.modulus == 4
    batch = spec.prompts(task, 4)
    records = both.target.records
    assert len(records) == len(batch) == 24 * 8 * 4
    np.testing.assert_array_equal(records["prompt_len"], batch.meta["prompt_len"])
    np.testing.assert_array_equal(both.length.records["correct"], records["correct"])
    with torch.no_grad():
        for i in range(0, len(batch), 53):  # 15 prompts over every shift and residue
            own = dsv4(batch.tokens[i:i + 1, : int(batch.meta["prompt_len"][i])])[0, int(batch.answer_pos[i])]
            assert int(own.argmax()) == int(records["predicted"][i]), i
    assert set(zip(records["target_residue"] % 4, records["length_residue"] % 4)) == {(a, b) for a in range(4)
                                                                                     for b in range(4)}


@pytest.mark.slow  # a claim about the shipped dsv4-tiny at the zoo task's size (80 s in a loaded -n 1 run)
def test_the_hugging_face_family_has_both_axes_too(dsv4):
    """dsv4-tiny (transformers' DeepSeek-V4): its weak spots follow the target's phase, not the length's."""
    model = dsv4
    both = phase_profile(model, pi.zoo.task_for(model), n_per_residue=72, axis="both", progress=False)
    assert both.target.period == 4 and both.target.phase_gap > 0.5
    assert both.length.period is None and both.length.phase_gap < 0.1
