"""`phaseinterp.load`: one loader for zoo names of both families, own checkpoint folders and Hugging
Face DeepSeek-V4 folders in either layout; the CLI takes the same sources (an exported release-layout
folder profiles); bad sources fail with one UserInputError naming what is accepted; the old loaders in
`phaseinterp.report` still work and warn."""

from __future__ import annotations

import pytest
import torch

import phaseinterp as pi
from phaseinterp.errors import UserInputError
from phaseinterp.models import CompressedTransformer

TOKENS = torch.arange(12)[None] % 8


@pytest.mark.zoo("w4s4")
def test_zoo_name_and_own_checkpoint_folder_load_the_same_model(tmp_path):
    from phaseinterp import zoo

    by_name = pi.load("w4s4")
    assert isinstance(by_name, CompressedTransformer) and not by_name.training
    by_name.save_pretrained(tmp_path / "copy")
    for source in (zoo.CHECKPOINT_DIR / "w4s4", str(tmp_path / "copy")):
        by_folder = pi.load(source)
        assert isinstance(by_folder, CompressedTransformer) and not by_folder.training
        with torch.no_grad():
            assert torch.equal(by_folder(TOKENS), by_name(TOKENS))


@pytest.mark.zoo("w4s4")
def test_dtype_and_device_are_applied_and_a_model_object_passes_through():
    model = pi.load("w4s4", dtype="float64", device="cpu")
    assert model.W_E.dtype == torch.float64 and model.W_E.device.type == "cpu"
    assert pi.load(model) is model
    with pytest.raises(UserInputError, match="already a model"):
        pi.load(model, device="cpu")


@pytest.mark.zoo("dsv4-tiny")
def test_hf_zoo_name_hf_folder_and_release_layout_folder_load(tmp_path):
    pytest.importorskip("transformers")
    from phaseinterp import zoo
    from phaseinterp.cli import main
    from phaseinterp.models.hf import HookedDeepseekV4

    by_name = pi.load("dsv4-tiny")
    hf_folder = pi.load(zoo.CHECKPOINT_DIR / "dsv4-tiny")
    assert isinstance(by_name, HookedDeepseekV4) and isinstance(hf_folder, HookedDeepseekV4)
    with torch.no_grad():
        assert torch.equal(hf_folder(TOKENS), by_name(TOKENS))
    assert main(["zoo", "export", "dsv4-tiny", "--layout", "deepseek", "--out", str(tmp_path / "release")]) == 0
    release = pi.load(tmp_path / "release")
    assert isinstance(release, HookedDeepseekV4)
    assert release.metadata["checkpoint"]["layout"] != "hf"
    with pytest.raises(UserInputError, match="device_map"):
        pi.load(tmp_path / "release", device="cpu", device_map="cpu")


@pytest.mark.zoo("dsv4-tiny")
def test_cli_profiles_an_exported_release_layout_folder(tmp_path, capsys):
    """`phaseinterp profile DIR` on `zoo export --layout deepseek` output profiles it (it said
    "not a phaseinterp checkpoint directory" before `phaseinterp.load`)."""
    pytest.importorskip("transformers")
    from phaseinterp.cli import main
    from phaseinterp.profile import PhaseProfile

    release = tmp_path / "release"
    assert main(["zoo", "export", "dsv4-tiny", "--layout", "deepseek", "--out", str(release)]) == 0
    assert main(["profile", str(release), "--n-per-residue", "72", "--out", str(tmp_path / "p")]) == 0
    profile = PhaseProfile.load(tmp_path / "p")
    assert profile.stride == 4 and profile.period == 4


@pytest.mark.parametrize("source", ["no-such-model", "w4s5", "", "/no/such/folder"])
def test_unknown_sources_name_what_is_accepted(source):
    with pytest.raises(UserInputError) as err:
        pi.load(source)
    message = str(err.value)
    assert "accepted:" in message and "zoo name" in message and "DeepSeek-V4" in message
    if source == "w4s5":
        assert "did you mean" in message


def test_a_folder_that_is_not_a_checkpoint_is_refused(tmp_path):
    with pytest.raises(UserInputError, match="is an empty folder"):  # the readers' door names the case
        pi.load(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UserInputError, match=r"is not a checkpoint \(a folder without config.json\)"):
        pi.load(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(UserInputError, match="model_type='llama'.*accepted:"):
        pi.load(tmp_path)


@pytest.mark.zoo("w4s4")
def test_hf_only_options_are_refused_for_own_models():
    with pytest.raises(UserInputError, match="device_map apply to Hugging Face"):
        pi.load("w4s4", device_map="auto")


def test_dir_shows_no_module_plumbing():
    names = dir(pi)
    assert "load" in names and "phase_profile" in names and "zoo" in names
    assert not {"Any", "annotations", "importlib", "_importlib"} & set(names)


@pytest.mark.zoo("w4s4", "w4s4-1kv-shared")
def test_labels_name_the_zoo_model_not_only_its_architecture():
    from phaseinterp.models.protocol import phase_model

    a, b = pi.load("w4s4"), pi.load("w4s4-1kv-shared")
    assert a.cfg.label == b.cfg.label  # one architecture label ...
    assert phase_model(a).label == "w4s4 (W4/S4 gated)"  # ... two names in results
    assert phase_model(b).label == "w4s4-1kv-shared (W4/S4 gated)"
