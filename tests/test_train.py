"""Training: smoke run, exact resume, divergence and interrupt handling, periodic rows."""

from __future__ import annotations

import json

import pytest
import torch

import phaseinterp.train.compressed as train_module
from phaseinterp import CompressedConfig, CompressedTransformer
from phaseinterp.tasks import KeyValueRetrieval
from phaseinterp.train import CurriculumStage, TrainConfig, TrainingDiverged, latest_checkpoint, periodic_rows, train

pytestmark = pytest.mark.slow  # trains

TASK = KeyValueRetrieval(seq_len=64, n_records=8, n_demos=2, min_distance=20, residue_modulus=8)
CFG = CompressedConfig(d_vocab=TASK.vocab.size, n_ctx=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                       d_head=16, d_mlp=64, window=4, stride=4, local_window=8)
TC = TrainConfig(steps=8, batch_size=8, lr=3e-3, warmup_steps=2, eval_every=4, checkpoint_every=4,
                 probe_per_residue=1, periodic_fraction=0.25,
                 curriculum=(CurriculumStage(0.5, {"n_records": (2, 6), "n_queries": None}),))


def test_training_smoke_runs_and_logs(tmp_path):
    result = train(CFG, TASK, train_config=TC, out_dir=tmp_path, progress=False)
    assert len(result.log) == 8 and result.log.loss.notna().all()
    assert set(result.curves.step) == {4, 8}
    assert set(result.curves.phase) == set(range(4))
    assert (tmp_path / "log.csv").is_file() and (tmp_path / "curves.csv").is_file()
    meta = CompressedTransformer.from_pretrained(latest_checkpoint(tmp_path / "checkpoints")).metadata
    assert meta["train_config"]["curriculum"][0]["task"]["n_records"] == [2, 6]
    assert meta["task_type"] == "KeyValueRetrieval"


def test_resume_reproduces_uninterrupted_run(tmp_path):
    full = train(CFG, TASK, train_config=TC, out_dir=tmp_path / "a", progress=False)
    train(CFG, TASK, train_config=TC, out_dir=tmp_path / "b", progress=False, stop_after=4)
    resumed = train(CFG, TASK, train_config=TC, out_dir=tmp_path / "b", progress=False, resume=True)
    assert full.log.loss.tolist() == resumed.log.loss.tolist()
    for (name, p), (_, q) in zip(full.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(p, q), name


class _FailingLoss:
    """Stands in for torch.nn.functional inside train: the k-th loss call misbehaves."""

    def __init__(self, at: int, kind: str):
        self.calls, self.at, self.kind = 0, at, kind

    def __getattr__(self, name):
        return getattr(torch.nn.functional, name)

    def cross_entropy(self, *args, **kwargs):
        self.calls += 1
        loss = torch.nn.functional.cross_entropy(*args, **kwargs)
        if self.calls == self.at:
            if self.kind == "nan":
                return loss * float("nan")
            raise KeyboardInterrupt
        return loss


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr(train_module, "F", _FailingLoss(at=6, kind="nan"))
    with pytest.raises(TrainingDiverged, match="loss became nan at step 5"):
        train(CFG, TASK, train_config=TC, out_dir=tmp_path, progress=False)
    ckpt = latest_checkpoint(tmp_path / "checkpoints")
    assert json.loads((ckpt / "train_state.json").read_text())["step"] == 4
    CompressedTransformer.from_pretrained(ckpt)  # intact


def test_ctrl_c_keeps_completed_steps(tmp_path, monkeypatch):
    monkeypatch.setattr(train_module, "F", _FailingLoss(at=7, kind="interrupt"))
    with pytest.raises(KeyboardInterrupt):
        train(CFG, TASK, train_config=TC, out_dir=tmp_path, progress=False)
    ckpt = latest_checkpoint(tmp_path / "checkpoints")
    assert json.loads((ckpt / "train_state.json").read_text())["step"] == 6
    monkeypatch.undo()
    resumed = train(CFG, TASK, train_config=TC, out_dir=tmp_path, progress=False, resume=True)
    reference = train(CFG, TASK, train_config=TC, progress=False)
    assert resumed.log.loss.tolist() == reference.log.loss.tolist()


def test_periodic_rows_are_periodic():
    tokens, targets, mask = periodic_rows(5, 30, 50, (2, 5), torch.Generator().manual_seed(0), low=4)
    for row, tgt, m in zip(tokens, targets, mask):
        period = next(b for b in range(2, 6) if torch.equal(row[b:], row[:-b]))
        assert torch.equal(tgt[:-1], row[1:])
        assert m[period - 1 : -1].all() and not m[: period - 1].any() and not m[-1]
    assert tokens.min() >= 4 and tokens.max() < 50


def test_learning_rate_schedule_and_stages():
    tc = TrainConfig(steps=100, warmup_steps=10, lr=1.0, min_lr_ratio=0.1,
                     curriculum=({"until": 0.5, "task": {"n_records": 3}},))
    assert tc.lr_at(0) == pytest.approx(0.1) and tc.lr_at(9) == pytest.approx(1.0)
    assert tc.lr_at(99) == pytest.approx(0.1, abs=1e-3)
    assert tc.stage_at(49) == {"n_records": 3} and tc.stage_at(50) == {}


@pytest.mark.parametrize("kwargs, match", [
    (dict(steps=0), "steps=0 must be an integer >= 1"),
    (dict(loss_on="all"), "loss_on='all' is not one of"),
    (dict(periodic_fraction=1.0), r"periodic_fraction=1 is out of range \[0, 1\)"),
    (dict(curriculum=({"until": 0.6}, {"until": 0.5})), "strictly increasing"),
])
def test_bad_train_configs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kwargs)


def test_train_rejects_mismatched_model():
    with pytest.raises(ValueError, match="d_vocab=10 is smaller than the task vocabulary"):
        train(CFG.replace(d_vocab=10), TASK, train_config=TC, progress=False)


def test_training_curves_figure(tmp_path):
    result = train(CFG, TASK, train_config=TC, progress=False)
    fig = result.plot()
    assert len(fig.data) == 4 + 1  # one line per phase, plus the loss
    assert any("boundary" in t.name for t in fig.data)
