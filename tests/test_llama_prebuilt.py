"""The prebuilt llama.cpp (``llama-cpp-py-sync``'s wheel) made to load on an older glibc, and its backend.

ELF tests: the patched copy loads, the wheel's own libraries fail with the glibc error (on a glibc
older than 2.38), the edit is idempotent and the cached copy reused, other too-new symbols are
refused in one line. Backend tests (slow): per-position logits of `PrebuiltLlama` against
llama-cpp-python on the same GGUF and against phaseinterp's forward, on the DeepSeek-V4 fixture
converted by llama.cpp's ``convert_hf_to_gguf.py`` (``PHASEINTERP_LLAMA_CPP_SRC``, as in
``test_llama_cpp.py``) and on a tiny random llama. The two llama.cpp builds share library names, so
each runs in its own process (this file's ``__main__``). `LlamaCppEngine(backend="prebuilt")` on the
converted fixture (CI's path: no llama-cpp-python): warm answers equal cold at every CSA phase and the HCA
boundaries of the shared prefix, a stale prefix cache is caught at the phases it breaks, and its
`phase_profile` predicts as phaseinterp's forward does. Under ``CI=true`` a missing
``llama_cpp_py_sync`` or converter fails these tests (a missing ``llama_cpp`` only where
``PHASEINTERP_LLAMA_OPTIONAL`` does not name it); elsewhere they are skipped.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from llama_fixtures import converted_dsv4_fixture, converter_source, require_llama_cpp_python  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "llama_cpp_dsv4.py"
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
TOKENS_TOLERANCE = 1e-4  # |logit| between two llama.cpp builds on one GGUF (f32 cache; llama: measured ~4e-6)
# The two builds' DeepSeek-V4 graphs round differently at a few positions (up to 1.2e-3 in |logit| measured, at 6 of
# 300; both then stay equally close to transformers, whose floor is ~3e-3 in log-probs).
DSV4_BUILDS_TOLERANCE = 5e-3
REFERENCE_TOLERANCE = 1e-2  # max |d log p| against phaseinterp's forward, as LLAMA_CPP_F32_TOLERANCE


def _missing(why: str, optional: str = ""):
    """Skip; under CI=true fail, unless ``optional`` is named in PHASEINTERP_LLAMA_OPTIONAL (CI compiles nothing,
    so llama-cpp-python, built from source, is optional there)."""
    if CI and optional not in os.environ.get("PHASEINTERP_LLAMA_OPTIONAL", "").split(",") or (CI and not optional):
        pytest.fail(f"{why}; under CI=true the prebuilt llama.cpp tests must run (pip install llama-cpp-py-sync)",
                    pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="module")
def source():
    """The installed ``llama_cpp_py_sync`` library folder."""
    from phaseinterp.engines.llama_prebuilt import PrebuiltLibraryError, installed_library_dir

    try:
        return installed_library_dir()
    except PrebuiltLibraryError as err:
        _missing(str(err))


def _target_glibc():
    """The machine's glibc, capped below 2.38 so that the edit runs on every machine."""
    from phaseinterp.engines.llama_prebuilt import machine_glibc

    return min(machine_glibc() or (2, 37), (2, 37))


@pytest.fixture(scope="module")
def patched(source, tmp_path_factory):
    """(cache root, patched folder) for `_target_glibc`."""
    from phaseinterp.engines.llama_prebuilt import compatible_library_dir

    root = tmp_path_factory.mktemp("prebuilt-cache")
    return root, compatible_library_dir(source, cache_root=root, glibc=_target_glibc())


# ------------------------------------------------------------------ the ELF edit
def test_patched_copy_loads_and_the_wheel_does_not(source, patched):
    """The copy holds every library under its name, needs no GLIBC_2.38, and names the classic
    functions at GLIBC_2.2.5; it loads (``ctypes.CDLL`` in dependency order). The wheel's own
    libraries fail with the loader's glibc message where the machine's glibc is older than 2.38."""
    from phaseinterp.engines.llama_prebuilt import (ElfImage, PrebuiltLibraryError, check_loads, library_files,
                                                    machine_glibc)

    root, folder = patched
    assert folder.parent == root and folder != source
    assert sorted(p.name for p in library_files(folder)) == sorted(p.name for p in library_files(source))
    image = ElfImage((folder / "libllama.so").read_bytes(), "libllama.so")
    assert "GLIBC_2.38" not in {n.name for n in image.needs}
    versions = {s.name: image.version_of(s).name for s in image.symbols if image.version_of(s) is not None}
    assert not any(name.startswith("__isoc23_") for name in versions)
    assert {versions[f] for f in ("strtol", "strtoul", "strtoull", "sscanf")} == {"GLIBC_2.2.5"}
    check_loads(folder)
    if shutil.which("readelf"):  # binutils reads the edited tables without a complaint
        done = subprocess.run(["readelf", "-V", "-W", str(folder / "libllama.so")], capture_output=True, text=True)
        assert done.returncode == 0 and "warning" not in (done.stdout + done.stderr).lower()
        assert "GLIBC_2.38" not in done.stdout and "__isoc23" not in done.stdout
    if (machine_glibc() or (99,)) < (2, 38):
        with pytest.raises(PrebuiltLibraryError, match=r"version `GLIBC_2\.38' not found") as caught:
            check_loads(source)
        assert "\n" not in str(caught.value)


def test_patch_is_idempotent_and_the_cache_is_reused(source, patched):
    from phaseinterp.engines.llama_prebuilt import MANIFEST, compatible_library_dir, library_files, patch_elf

    root, folder = patched
    for path in library_files(folder):
        data = path.read_bytes()
        again, renamed = patch_elf(data, _target_glibc(), path.name)
        assert again == data and renamed == []
    stamps = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert compatible_library_dir(source, cache_root=root, glibc=_target_glibc()) == folder
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == stamps
    assert [p.name for p in root.iterdir()] == [folder.name]  # no staging folder left behind
    assert (folder / MANIFEST).is_file()
    # A folder whose libraries need nothing newer than the machine's glibc is used as it is.
    assert compatible_library_dir(folder, cache_root=root, glibc=_target_glibc()) == folder


def test_another_too_new_symbol_is_refused_in_one_line(source, tmp_path):
    """A copy whose GLIBC_2.29 need is renamed GLIBC_2.99 (same length, in .dynstr): its libm
    symbols are then too new and have no older equivalent, so the edit refuses and names them; the
    cache gets nothing."""
    from phaseinterp.engines.llama_prebuilt import (ElfImage, PrebuiltLibraryError, compatible_library_dir,
                                                    patch_elf, too_new_symbols)

    data = (source / "libggml-base.so.0").read_bytes()
    assert data.count(b"GLIBC_2.29\0") >= 1
    edited = data.replace(b"GLIBC_2.29\0", b"GLIBC_2.99\0")
    wanted = sorted(ElfImage(edited).glibc_requirements()["GLIBC_2.99"])
    assert wanted  # log2 in llama-cpp-py-sync 0.11739
    with pytest.raises(PrebuiltLibraryError) as caught:
        patch_elf(edited, (2, 36), "libggml-base.so.0")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("libggml-base.so.0 needs symbols newer than")
    assert all(f"{name}@GLIBC_2.99" in message for name in wanted) and "__isoc23_strtol@" not in message
    folder = tmp_path / "wheel"
    folder.mkdir()
    for path in source.glob("lib*.so*"):
        shutil.copy(path, folder / path.name)
    (folder / "libggml-base.so.0").write_bytes(edited)
    with pytest.raises(PrebuiltLibraryError, match=re.escape(f"{wanted[0]}@GLIBC_2.99")):
        compatible_library_dir(folder, cache_root=tmp_path / "cache", glibc=(2, 36))
    assert list((tmp_path / "cache").iterdir()) == []
    # The checker on parsed data: only the four C23 aliases may be newer than the machine's glibc.
    assert too_new_symbols({"GLIBC_2.38": ["__isoc23_strtol", "__isoc23_sscanf"], "GLIBC_2.2.5": ["free"]},
                           (2, 36)) == {}
    assert too_new_symbols({"GLIBC_2.38": ["__isoc23_strtol", "__isoc23_fscanf"], "GLIBC_2.39": ["pidfd_spawn"]},
                           (2, 36)) == {"GLIBC_2.38": ["__isoc23_fscanf"], "GLIBC_2.39": ["pidfd_spawn"]}
    assert too_new_symbols({"GLIBC_2.39": ["pidfd_spawn"]}, (2, 39)) == {}


def test_missing_base_version_is_refused(source):
    """Without a GLIBC_2.2.5 need on libc there is no version to move the aliases to (none is added)."""
    from phaseinterp.engines.llama_prebuilt import PrebuiltLibraryError, patch_elf

    edited = (source / "libggml-base.so.0").read_bytes().replace(b"GLIBC_2.2.5\0", b"GLIBC_2.2.4\0")
    with pytest.raises(PrebuiltLibraryError, match=r"has no GLIBC_2\.2\.5 need on libc\.so\.6"):
        patch_elf(edited, (2, 36), "libggml-base.so.0")


# ------------------------------------------------------------------ the backend, one process per llama.cpp
def _worker(kind: str, gguf: Path, ids: np.ndarray, out: Path, *, library_dir=None, steps: int,
            pieces=(), keep: int = 0) -> dict:
    """Run this file's ``__main__`` in a fresh process; its arrays (or the crash) come back."""
    np.save(out.with_suffix(".ids.npy"), ids)
    argv = [sys.executable, __file__, kind, str(gguf), str(out.with_suffix(".ids.npy")), str(out), str(steps),
            ",".join(map(str, pieces)), str(keep), str(library_dir or "")]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert done.returncode == 0, f"{kind} worker exited {done.returncode}: {done.stderr[-3000:]}"
    return dict(np.load(out))


def _log_probs(x):
    import torch

    return torch.log_softmax(torch.as_tensor(np.asarray(x)).float(), dim=-1)


@pytest.fixture(scope="module")
def dsv4_converted(tmp_path_factory):
    """(release folder, GGUF) of the DeepSeek-V4 fixture, as in ``test_llama_cpp.py`` (the converter only)."""
    src = converter_source(_missing)
    root = tmp_path_factory.mktemp("prebuilt_dsv4")
    return converted_dsv4_fixture(root, src)


@pytest.fixture(scope="module")
def dsv4_gguf(dsv4_converted):
    """`dsv4_converted` where llama-cpp-python is installed too (to compare the two builds)."""
    require_llama_cpp_python(_missing)
    return dsv4_converted


@pytest.fixture(scope="module")
def llama_gguf(tmp_path_factory):
    """(folder, GGUF) of a tiny random llama (2 layers, grouped-query attention, vocabulary 512)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    require_llama_cpp_python(_missing)
    src = converter_source(_missing)
    sys.path.insert(0, str(SCRIPT.parent))
    from llama_cpp_dsv4 import write_tokenizer

    root = tmp_path_factory.mktemp("prebuilt_llama")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, bos_token_id=0,
                         eos_token_id=1, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, 1.0)
        model.lm_head.weight.normal_(0.0, 0.3)
    model.save_pretrained(root / "hf")
    write_tokenizer(root / "hf", 512, 0, 1)
    done = subprocess.run([sys.executable, str(SCRIPT), "convert", str(root / "hf"), str(root / "llama.gguf"),
                           "--llama-cpp-src", src], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "hf", root / "llama.gguf"


@pytest.mark.slow
def test_prebuilt_matches_llama_cpp_python_and_transformers_on_a_tiny_llama(patched, llama_gguf, tmp_path):
    """Every position's logits (one ``llama_decode`` per token) equal llama-cpp-python's on the same
    GGUF and transformers'; the whole prompt at once, in pieces, and after trimming the cache to a
    prefix (``keep_prefix``) and feeding the rest give the same last logits."""
    import torch
    from transformers import LlamaForCausalLM

    ids = np.random.default_rng(0).integers(2, 512, 120)
    pre = _worker("prebuilt", llama_gguf[1], ids, tmp_path / "pre.npz", library_dir=patched[1], steps=120,
                  pieces=(1, 63, 56), keep=50)
    ref_cpp = _worker("llama_cpp", llama_gguf[1], ids, tmp_path / "cpp.npz", steps=120)
    hf = LlamaForCausalLM.from_pretrained(llama_gguf[0], dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor(ids)[None]).logits[0].numpy()
    assert pre["steps"].shape == (120, 512)
    np.testing.assert_allclose(pre["steps"], ref_cpp["steps"], atol=TOKENS_TOLERANCE, rtol=0)
    np.testing.assert_allclose(pre["steps"], ref, atol=1e-4, rtol=0)
    for key in ("whole", "pieces", "warm"):
        np.testing.assert_allclose(pre[key], pre["steps"][-1], atol=1e-5, rtol=0, err_msg=key)
    assert int(pre["warm_refused"]) == 0


@pytest.mark.slow
def test_prebuilt_runs_the_converted_deepseek_v4_like_llama_cpp_python(patched, dsv4_gguf, tmp_path):
    """On the DeepSeek-V4 fixture (converter output): 300 positions one token at a time (past the
    128-token window and HCA block) and one 2,304-token prompt (past the indexer's top-k of 512
    compressed entries), whole and in pieces. The prebuilt equals llama-cpp-python within
    `DSV4_BUILDS_TOLERANCE`; against phaseinterp's forward each position is within
    `REFERENCE_TOLERANCE` or no further than llama-cpp-python is (plus that tolerance). DeepSeek-V4's memory refuses
    to drop a suffix (``llama_memory_seq_rm`` returns false; only a clear resets it)."""
    import torch

    import phaseinterp as pi

    g = np.random.default_rng(0)
    ids = g.integers(2, 512, 2304)
    pieces = (1, 511, 512, 512, 512, 256)
    pre = _worker("prebuilt", dsv4_gguf[1], ids, tmp_path / "pre.npz", library_dir=patched[1], steps=300,
                  pieces=pieces, keep=128)
    ref_cpp = _worker("llama_cpp", dsv4_gguf[1], ids, tmp_path / "cpp.npz", steps=300)
    np.testing.assert_allclose(pre["steps"], ref_cpp["steps"], atol=DSV4_BUILDS_TOLERANCE, rtol=0)
    np.testing.assert_allclose(pre["whole"], ref_cpp["whole"], atol=DSV4_BUILDS_TOLERANCE, rtol=0)
    np.testing.assert_allclose(pre["pieces"], pre["whole"], atol=1e-5, rtol=0)
    assert int(pre["warm_refused"]) == 1
    model = pi.load_hf(dsv4_gguf[0], dtype=torch.float32)
    with torch.no_grad():
        ref = _log_probs(model(torch.tensor(ids[:300])[None])[0])
        ref_last = _log_probs(model(torch.tensor(ids)[None])[0, -1])
    ours = (_log_probs(pre["steps"]) - ref).abs().amax(-1)
    theirs = (_log_probs(ref_cpp["steps"]) - ref).abs().amax(-1)
    assert bool((ours <= torch.clamp(theirs + DSV4_BUILDS_TOLERANCE, min=REFERENCE_TOLERANCE)).all()), ours.max()
    assert float(ours.median()) < REFERENCE_TOLERANCE
    assert float((_log_probs(pre["whole"]) - ref_last).abs().max()) < REFERENCE_TOLERANCE


@pytest.mark.slow
def test_prebuilt_refuses_to_share_a_process_with_llama_cpp_python(patched, llama_gguf, tmp_path):
    done = subprocess.run([sys.executable, __file__, "clash", str(llama_gguf[1]), "", "", "0", "", "0",
                           str(patched[1])], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "another llama.cpp is already loaded in this process" in done.stdout


# ------------------------------------------------------------------ LlamaCppEngine on the prebuilt
WARM_TASK = dict(seq_len=640, n_records=12, n_demos=2, residue_modulus=4, padding="in_sequence")
# Shared-prefix lengths L: 255..258 visit every CSA phase (L mod 4) around the HCA boundary 256; 128 and 384 are
# HCA boundaries too (L mod 128 = 0).
WARM_LENGTHS = (128, 255, 256, 257, 258, 384)
WARM_TOLERANCE = 1e-4  # max |d log p| of warm against cold on one build (measured: up to 8e-6)
STALE_LENGTHS = (255, 256, 257, 258)


def test_engine_on_a_prebuilt_that_cannot_load_is_one_clear_line(source, tmp_path, monkeypatch):
    """`LlamaCppEngine(backend="prebuilt")` on a wheel whose libm symbols need a glibc no machine has
    (GLIBC_2.29 renamed GLIBC_2.99): one line naming the library, the symbols and this machine's glibc;
    ``backend="auto"`` with llama-cpp-python missing too names both reasons, also in one line."""
    from phaseinterp.engines.llama_cpp import LlamaCppEngine
    from phaseinterp.engines.llama_prebuilt import PrebuiltLibraryError, machine_glibc

    glibc = machine_glibc()
    if glibc is None:
        pytest.skip("not a glibc machine")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = tmp_path / "wheel"
    folder.mkdir()
    for path in source.glob("lib*.so*"):
        shutil.copy(path, folder / path.name, follow_symlinks=False)
    base = folder / "libggml-base.so.0"
    base.write_bytes(base.read_bytes().replace(b"GLIBC_2.29\0", b"GLIBC_2.99\0"))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    glibc_text = ".".join(map(str, glibc))
    with pytest.raises(PrebuiltLibraryError) as caught:
        LlamaCppEngine(gguf, backend="prebuilt", library_dir=folder)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("libggml-base.so.0 needs symbols newer than this machine's "
                                                       f"glibc {glibc_text}")
    assert re.search(r"\blog2@GLIBC_2\.99\b", message) and "phaseinterp[llama-source]" in message
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # llama-cpp-python missing
    with pytest.raises(ImportError) as caught:
        LlamaCppEngine(gguf, library_dir=folder)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("LlamaCppEngine found no llama.cpp that runs here")
    assert "log2@GLIBC_2.99" in message and "phaseinterp[llama-source]" in message


@pytest.fixture(scope="module")
def prebuilt_engine_run(source, dsv4_converted, tmp_path_factory):
    """This file's ``engine`` worker on the converted fixture (a process of its own, the installed wheel
    made loadable in a fresh cache folder as a user's first run makes it): its conformance results and
    phase profiles."""
    out = tmp_path_factory.mktemp("prebuilt_engine")
    argv = [sys.executable, __file__, "engine", str(dsv4_converted[1]), str(dsv4_converted[0]), str(out),
            str(tmp_path_factory.mktemp("xdg_cache"))]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=1800)
    assert done.returncode == 0, f"engine worker exited {done.returncode}: {done.stderr[-3000:]}"
    return out


@pytest.mark.slow
def test_prebuilt_engine_warm_answers_as_cold_at_csa_phases_and_hca_boundaries(prebuilt_engine_run):
    """`LlamaCppEngine(backend="prebuilt", reuse="checkpoint")` (``llama_state_seq_get_data`` after the
    donor's first ``L`` tokens, restored after the donor) against itself cold, by conformance's warm mode:
    4 prompts of 640 tokens per ``L`` of `WARM_LENGTHS`, within `WARM_TOLERANCE` with the same top-1.
    The in-place reuse (``llama_memory_seq_rm``) is refused by DeepSeek-V4's memory in one line."""
    from phaseinterp.engines.result import ConformanceResult

    result = ConformanceResult.load(prebuilt_engine_run / "warm")
    table = result.table
    cuts = table[table.kind == "cut"]
    assert sorted(cuts.phase) == [0, 1, 2, 127]  # L mod 128: 0 pools the three HCA boundaries 128, 256, 384
    assert sorted(set(result.records.prefix_len)) == list(WARM_LENGTHS)
    assert sorted(set(result.records.prefix_len % 4)) == [0, 1, 2, 3]
    assert len(result.records) == len(WARM_LENGTHS) * 4
    assert table.passed.all() and (table.agreement == 1.0).all(), table[["kind", "phase", "max_abs_diff"]]
    assert float(result.records.max_abs_diff.max()) <= WARM_TOLERANCE
    refusal = (prebuilt_engine_run / "seq_rm.txt").read_text()
    assert refusal.startswith("llama.cpp refused to drop positions 256.. of the donor") and "\n" not in refusal


@pytest.mark.slow
def test_a_stale_prefix_cache_on_the_prebuilt_is_caught_where_it_breaks(prebuilt_engine_run):
    """A prefix cache that resumes only at the end of a CSA window (``ceil(L / 4) * 4``: the donor's
    tokens fill the rest of the open window, as a block-granular cache that over-matches would) equals
    cold where ``L`` is a multiple of 4 and fails at the other CSA phases: conformance names exactly
    the cut phases of 255, 257 and 258."""
    from phaseinterp.engines.result import ConformanceResult

    result = ConformanceResult.load(prebuilt_engine_run / "stale")
    assert result.failing_phases("stale", "cut") == (1, 2, 127)
    records = result.records
    assert float(records[records.prefix_len == 256].max_abs_diff.max()) <= WARM_TOLERANCE
    assert float(records[records.prefix_len != 256].max_abs_diff.min()) > 10 * WARM_TOLERANCE


@pytest.mark.slow
def test_prebuilt_engine_profile_predicts_as_phaseinterps_forward(prebuilt_engine_run):
    """`engine_profile` of the prebuilt engine and `phase_profile` of phaseinterp's DeepSeek-V4 forward (`load_hf`) on the same
    16 prompts: the same prediction for every prompt, the answer's log-prob within `REFERENCE_TOLERANCE`."""
    import pandas as pd

    ours = pd.read_pickle(prebuilt_engine_run / "profile_engine.pkl")
    ref = pd.read_pickle(prebuilt_engine_run / "profile_forward.pkl")
    assert len(ours) == len(ref) == 16
    assert (ours.phase.to_numpy() == ref.phase.to_numpy()).all()
    assert (ours.predicted.to_numpy() == ref.predicted.to_numpy()).all()
    diff = np.abs(ours.answer_logprob.to_numpy() - ref.answer_logprob.to_numpy())
    assert float(diff.max()) < REFERENCE_TOLERANCE, diff


def _engine_main(gguf, release, out, cache_home):
    """Worker: conformance's warm mode of `LlamaCppEngine(backend="prebuilt")` against itself cold
    (``warm``), the same with a stale prefix cache (``stale``), the seq_rm refusal (``seq_rm.txt``), and
    the records of `engine_profile` through the engine and of `phase_profile` through phaseinterp's forward."""
    import torch

    import phaseinterp as pi
    from phaseinterp.engines import conformance, engine_profile
    from phaseinterp.engines.check import donor_prompts
    from phaseinterp.engines.llama_cpp import LlamaCppEngine
    from phaseinterp.errors import UserInputError
    from phaseinterp.profile import phase_profile
    from phaseinterp.tasks import KeyValueRetrieval

    os.environ["XDG_CACHE_HOME"] = cache_home  # where compatible_library_dir() puts the patched copy
    os.environ["PHASEINTERP_NO_PROGRESS"] = "1"
    torch.set_num_threads(1)  # one thread each: ggml's workers spin, so two on two shared cores thrash
    out = Path(out)
    model = pi.load_hf(release, dtype=torch.float32)
    task = KeyValueRetrieval(**WARM_TASK)
    cold = LlamaCppEngine(gguf, n_ctx=648, cache_type="f32", n_threads=1, backend="prebuilt", name="prebuilt")
    assert cold.backend == "prebuilt", cold
    options = dict(modes=(), reference=cold, n_per_residue=1, answer_phases=(3,), progress=False)
    conformance(model, task, warm_engines={"prebuilt:warm": cold}, prefix_lengths=WARM_LENGTHS,
                tolerance={"prebuilt:warm": WARM_TOLERANCE}, **options).save(out / "warm")

    class StaleCache:
        """Resumes at the end of the open CSA window: the donor's tokens stand in for the prompt's up to there."""

        name = "stale"

        def __call__(self, tokens):
            return cold(tokens)

        def warm(self, donors, tokens, prefix_len):
            reused = -(-prefix_len // 4) * 4
            served = torch.cat([donors[:, :reused], tokens[:, reused:]], 1)
            return cold.warm(donors, served, reused) if reused > prefix_len else cold.warm(donors, tokens, prefix_len)

    conformance(model, task, warm_engines={"stale": StaleCache()}, prefix_lengths=STALE_LENGTHS,
                tolerance={"stale": WARM_TOLERANCE}, **options).save(out / "stale")
    tokens = task.generate(1, seed=0, strict=False).tokens
    try:
        cold.with_schedule(None, "rm", reuse="seq_rm").warm(donor_prompts(tokens, 256, task.vocab.filler_ids),
                                                             tokens, 256)
    except UserInputError as err:
        (out / "seq_rm.txt").write_text(str(err))
    batch = task.generate(4, seed=0, strict=False)
    engine_profile(cold, batch, stride=4, progress=False).records.to_pickle(out / "profile_engine.pkl")
    phase_profile(model, batch, progress=False).records.to_pickle(out / "profile_forward.pkl")
    cold.close()


def _main(kind, gguf, ids_file, out, steps, pieces, keep, library_dir):
    """Worker: ``steps`` positions one token each (``steps``), the whole prompt (``whole``), the prompt
    in ``pieces`` (``pieces``), and (prebuilt, ``keep`` > 0) the cache trimmed to ``keep`` after
    ``keep + 20`` tokens then the rest (``warm``; ``warm_refused`` where llama.cpp cannot trim)."""
    steps, keep = int(steps), int(keep)
    if kind == "clash":
        import llama_cpp  # noqa: F401  (its libllama.so.0 is loaded on import)

        from phaseinterp.engines.llama_prebuilt import PrebuiltLibraryError, PrebuiltLlama

        try:
            PrebuiltLlama(gguf, n_ctx=64, n_batch=64, library_dir=library_dir)
        except PrebuiltLibraryError as err:
            print(err)
        return
    ids = [int(t) for t in np.load(ids_file)]
    n_ctx = len(ids) + 8
    result = {}
    if kind == "prebuilt":
        from phaseinterp.engines.llama_prebuilt import PrebuiltLlama

        llm = PrebuiltLlama(gguf, n_ctx=n_ctx, n_batch=n_ctx, cache_type="f32", n_threads=2, library_dir=library_dir)
        rows = []
        llm.clear()
        for i in range(steps):
            llm.decode([ids[i]], i)
            rows.append(llm.last_logits())
        result["steps"] = np.stack(rows)
        llm.clear()
        llm.decode(ids, 0)
        result["whole"] = llm.last_logits()
        if pieces:
            llm.clear()
            start = 0
            for n in map(int, pieces.split(",")):
                llm.decode(ids[start:start + n], start)
                start += n
            assert start == len(ids), (start, len(ids))
            result["pieces"] = llm.last_logits()
        if keep:
            llm.clear()
            llm.decode(ids[:keep + 20], 0)
            try:
                llm.keep_prefix(keep)
                llm.decode(ids[keep:], keep)
                result["warm"], result["warm_refused"] = llm.last_logits(), 0
            except RuntimeError:
                result["warm_refused"] = 1
        llm.close()
    else:
        import llama_cpp

        llm = llama_cpp.Llama(model_path=gguf, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=2,
                              n_threads_batch=2, logits_all=False, type_k=llama_cpp.GGML_TYPE_F32,
                              type_v=llama_cpp.GGML_TYPE_F32, flash_attn=False, verbose=False)
        n_vocab = llm.n_vocab()

        def last():
            pointer = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
            return np.ctypeslib.as_array(pointer, shape=(n_vocab,)).astype(np.float32, copy=True)

        llm.reset()
        rows = []
        for i in range(steps):
            llm.eval([ids[i]])
            rows.append(last())
        result["steps"] = np.stack(rows)
        llm.reset()
        llm.eval(ids)
        result["whole"] = last()
        llm.close()
    np.savez(out, **result)


if __name__ == "__main__":
    if sys.argv[1] == "engine":
        _engine_main(*sys.argv[2:6])
    else:
        _main(*sys.argv[1:9])
