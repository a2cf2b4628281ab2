"""phase_profile: a stub model with known phase behaviour is recovered exactly; errors; I/O; plotting."""

import subprocess
import sys
import types

import numpy as np
import pytest
import torch

from phaseinterp.profile import PhaseProfile, phase_profile
from phaseinterp.tasks import KeyValueRetrieval, Vocab

TASK = KeyValueRetrieval()


class PhaseOracle(torch.nn.Module):
    """Test fixture (never shipped): answers correctly iff the target key's phase is in ``good``.

    It finds the target record by looking up the last token's first earlier occurrence, so its
    behaviour is known by construction for every KeyValueRetrieval prompt.
    """

    def __init__(self, vocab: Vocab, good: set[int], stride: int = 4, n_ctx: int = 256, compression="gated"):
        super().__init__()
        self.cfg = types.SimpleNamespace(
            d_vocab=vocab.size, n_ctx=n_ctx, stride=stride, compression=compression, label=f"oracle {sorted(good)}"
        )
        self.good = torch.tensor(sorted(good), dtype=torch.long)
        self.wrong = torch.tensor(vocab.value_ids[:2])
        self.dummy = torch.nn.Parameter(torch.zeros(()))  # gives the module a device

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        b, T = tokens.shape
        source = (tokens[:, :-1] == tokens[:, -1:]).int().argmax(dim=1)
        value = tokens[torch.arange(b), source + 1]
        ok = torch.isin(source % self.cfg.stride, self.good)
        wrong = torch.where(value == self.wrong[0], self.wrong[1], self.wrong[0])
        logits = torch.zeros(b, T, self.cfg.d_vocab)
        logits[torch.arange(b), -1, torch.where(ok, value, wrong)] = 4.0
        return logits + self.dummy


class CoinModel(PhaseOracle):
    """Test fixture: right on a fixed pseudo-random 70% of prompts, whatever the phase."""

    def forward(self, tokens):
        logits = super().forward(tokens)
        b = tokens.shape[0]
        source = (tokens[:, :-1] == tokens[:, -1:]).int().argmax(dim=1)
        value = tokens[torch.arange(b), source + 1]
        coin = (tokens.sum(dim=1) * 2654435761 % 1000) < 700
        logits[:, -1] = 0
        logits[torch.arange(b), -1, torch.where(coin, value, self.wrong[0])] = 4.0
        return logits


@pytest.mark.parametrize("padding", ["prefix", "in_sequence"])
def test_profile_of_a_known_model_is_recovered_exactly(padding):
    task = KeyValueRetrieval(padding=padding)
    model = PhaseOracle(task.vocab, good={0, 1, 2})  # the boundary phase 3 fails
    profile = phase_profile(model, task, n_per_residue=100, batch_size=500, progress=False)
    expected = (np.arange(24) % 4 != 3).astype(float)
    assert np.array_equal(profile.residue_accuracy, expected)
    assert np.array_equal(profile.phase_accuracy, [1.0, 1.0, 1.0, 0.0])
    assert (profile.residue_n == 100).all() and (profile.phase_n == 600).all()
    assert profile.worst_phases == (3,) and profile.gap == 1.0 and profile.phase_gap == 1.0
    assert profile.mean == 0.75 and profile.period == 4 and profile.period_p_value < 0.01
    assert profile.homogeneity_p_value < 1e-10 and profile.interval_method == "wilson"
    frame = profile.to_frame()
    assert (frame["correct"] == (frame["target_pos"] % 4 != 3)).all()
    assert (frame["phase"] == frame["target_pos"] % 4).all() and len(frame) == 2400
    assert ((profile.residue_lower <= expected) & (expected <= profile.residue_upper)).all()


def test_stride_8_model_and_stride_override():
    model = PhaseOracle(TASK.vocab, good=set(range(6)), stride=8)  # phases 6, 7 fail
    profile = phase_profile(model, TASK, n_per_residue=100, progress=False)
    assert profile.worst_phases == (6, 7) and profile.period == 8 and profile.stride == 8
    assert np.array_equal(profile.phase_accuracy, [1.0] * 6 + [0.0] * 2)
    folded = phase_profile(model, TASK, n_per_residue=100, stride=4, progress=False)  # fold the same data to S=4
    assert np.array_equal(folded.phase_accuracy, [1.0, 1.0, 0.5, 0.5]) and folded.period == 8
    assert np.array_equal(folded.residue_accuracy, profile.residue_accuracy)


def test_full_attention_baseline_is_homogeneous():
    always = PhaseOracle(TASK.vocab, good={0, 1, 2, 3}, compression=None)
    profile = phase_profile(always, TASK, n_per_residue=100, progress=False)
    assert profile.gap == 0 and profile.period is None and profile.homogeneity_p_value == 1.0
    coin = CoinModel(TASK.vocab, good=set(), compression=None)
    noisy = phase_profile(coin, TASK, n_per_residue=250, progress=False)
    assert 0.6 < noisy.mean < 0.8 and noisy.period is None and noisy.homogeneity_p_value > 0.05


def test_shared_mappings_switch_to_cluster_bootstrap():
    batch = TASK.generate(100, seed=0, n_mappings=40)
    model = PhaseOracle(TASK.vocab, good={0, 1, 2})
    profile = phase_profile(model, batch, progress=False, n_bootstrap=500)
    assert profile.interval_method == "cluster_bootstrap"
    assert np.array_equal(profile.residue_accuracy, (np.arange(24) % 4 != 3).astype(float))
    assert ((profile.phase_lower <= profile.phase_accuracy) & (profile.phase_accuracy <= profile.phase_upper)).all()


def test_batching_and_training_mode_do_not_change_results():
    model = PhaseOracle(TASK.vocab, good={1, 2})
    model.train()
    batch = TASK.generate(72, seed=4)
    a = phase_profile(model, batch, batch_size=100, progress=False)
    b = phase_profile(model, batch, batch_size=1000, progress=False)
    assert model.training
    assert a.to_frame().equals(b.to_frame()) and a.to_dict() == b.to_dict() and a == b


def test_each_module_s_training_flag_is_restored_also_after_an_interrupt():
    """A model in training with one submodule frozen in eval keeps each module's own flag after
    `phase_profile`, and after a KeyboardInterrupt inside it (``model.train(was)`` made them uniform)."""
    from test_model import make

    model = make(0, window=4, stride=4, n_ctx=TASK.seq_len, d_vocab=TASK.vocab.size).train()
    model.blocks[0].eval()
    flags = [m.training for m in model.modules()]
    batch = TASK.generate(1, seed=4, strict=False)
    phase_profile(model, batch, progress=False, n_bootstrap=10, n_permutations=9)
    assert [m.training for m in model.modules()] == flags

    def interrupt(x, hook):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), model.hooks(fwd_hooks=[("blocks.1.hook_resid_post", interrupt)]):
        phase_profile(model, batch, progress=False)
    assert [m.training for m in model.modules()] == flags


def test_bad_requests_raise_clear_errors():
    model = PhaseOracle(TASK.vocab, good={0})
    with pytest.raises(ValueError, match=r"R=24 is not a multiple of stride=5"):
        phase_profile(model, TASK, n_per_residue=100, stride=5, progress=False)
    no_stride = PhaseOracle(TASK.vocab, good={0})
    del no_stride.cfg.stride
    with pytest.raises(ValueError, match="pass stride="):
        phase_profile(no_stride, TASK, n_per_residue=100, progress=False)
    small_vocab = PhaseOracle(TASK.vocab, good={0})
    small_vocab.cfg.d_vocab = 64
    with pytest.raises(ValueError, match=r"out of range for d_vocab=64"):
        phase_profile(small_vocab, TASK, n_per_residue=100, progress=False)
    short = PhaseOracle(TASK.vocab, good={0}, n_ctx=64)
    with pytest.raises(ValueError, match="n_ctx is 64"):
        phase_profile(short, TASK, n_per_residue=100, progress=False)
    with pytest.raises(ValueError, match="interval='exact'"):
        phase_profile(model, TASK, n_per_residue=100, interval="exact", progress=False)


def test_save_load_round_trip(tmp_path):
    profile = phase_profile(PhaseOracle(TASK.vocab, good={0, 1, 2}), TASK, n_per_residue=72, progress=False)
    path = profile.save(tmp_path / "profile")
    assert sorted(p.name for p in path.iterdir()) == ["arrays.npz", "meta.json"]  # no temp files left
    loaded = PhaseProfile.load(path)
    assert loaded.to_dict() == profile.to_dict() and loaded == profile
    assert loaded == PhaseProfile.load(profile.save(tmp_path / "again"))  # two loaded copies compare equal
    assert loaded.summary().equals(profile.summary())
    assert loaded.residue_frame().equals(profile.residue_frame())
    assert loaded.phase_frame().equals(profile.phase_frame())
    assert loaded.to_frame()["correct"].equals(profile.to_frame()["correct"])


@pytest.mark.slow  # spawns a process
def test_plot_is_a_plotly_figure_and_core_imports_stay_light():
    profile = phase_profile(PhaseOracle(TASK.vocab, good={0, 1, 2}), TASK, n_per_residue=72, progress=False)
    fig = profile.plot()
    assert type(fig).__name__ == "Figure" and len(fig.data) == 4 + 2  # 4 phases + line + phase bars
    code = ("import sys, phaseinterp.profile, phaseinterp.tasks, phaseinterp.stats, "
            "phaseinterp.interventions; assert 'plotly' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_documented_workable_sizes_of_the_zoo_task():
    """README and the CLI help say: for the zoo task, n_per_residue 72, 77, 80 and every size from 86."""
    from phaseinterp import zoo

    task = zoo.entry("w4s4").task_object()
    workable = []
    for n in range(60, 201):
        try:
            task.placement(n)
        except ValueError as err:
            assert f"n_per_residue={n}" in str(err)
            continue
        workable.append(n)
    assert workable == [72, 77, 80, *range(86, 201)]


@pytest.mark.parametrize("interval", ["wilson", "cluster_bootstrap"])
def test_a_phase_s_interval_holds_its_residue_mean_when_residues_hold_unequal_prompts(interval):
    """A phase's accuracy is its residues' mean (the paper's fold); with 100 and 2 prompts in its two
    residues (all right, none right) that is 0.5 where the pooled share is 0.98, and its interval is the
    mean's (it was the pooled share's, [0.93, 0.995], which left the estimate outside). Residues of equal
    size keep the pooled Wilson interval exactly."""
    import pandas as pd

    from phaseinterp import stats
    from phaseinterp.profile import profile_from_records

    sizes = [100, 20, 20, 20, 2, 20, 20, 20]
    residue = np.repeat(np.arange(8), sizes)
    correct = np.ones(residue.size, dtype=bool)
    correct[residue == 4] = False
    for r in (1, 2, 3, 5, 6, 7):
        correct[np.flatnonzero(residue == r)[:10]] = False
    records = pd.DataFrame({"residue": residue, "correct": correct, "mapping_id": np.arange(residue.size) // 2})
    p = profile_from_records(records, 8, 4, interval=interval, n_bootstrap=400, n_permutations=99)
    assert p.phase_accuracy[0] == pytest.approx(0.5)
    assert (p.phase_lower <= p.phase_accuracy).all() and (p.phase_accuracy <= p.phase_upper).all()
    assert p.phase_upper[0] - p.phase_lower[0] > 0.3  # about 8 prompts' worth of evidence, not 102
    balanced = records[records.groupby("residue").cumcount() < 2]
    q = profile_from_records(balanced.reset_index(drop=True), 8, 4, interval="wilson", n_permutations=99)
    lo, hi = stats.wilson_interval(q.phase_correct, q.phase_n)
    np.testing.assert_array_equal(q.phase_lower, lo)
    np.testing.assert_array_equal(q.phase_upper, hi)
