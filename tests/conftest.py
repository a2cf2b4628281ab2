"""Test set-up: jaxtyping runtime shape checks on every phaseinterp function, fixed seeds."""

import os

os.environ.setdefault("PHASEINTERP_NO_PROGRESS", "1")

from jaxtyping import install_import_hook  # noqa: E402

# Must run before anything imports phaseinterp: every annotated function is then checked.
# `import phaseinterp` is lazy (the CLI's --help must not wait for torch), so import the core
# modules here, inside the hook: the ones `import phaseinterp` used to load eagerly.
# Test files add no hook of their own on a phaseinterp package: one instruments only modules not yet
# imported, so which file pytest collects first would decide for every later file (phaseinterp.engines
# was checked or not by collection order: test_bad_inputs_fuzz's column doors failed after test_engine_profile).
with install_import_hook("phaseinterp", "typecheck.typecheck"):
    import importlib

    for _module in ("config", "phase", "stats", "tasks", "results", "profile", "models",
                    "interventions", "zoo"):
        importlib.import_module(f"phaseinterp.{_module}")

import pytest  # noqa: E402
import torch  # noqa: E402

from phaseinterp.models import allocator  # noqa: E402

# As the command line does before every command: freed memory stays in the process (a forward's
# intermediates are not page-faulted in again each layer; `phaseinterp.models.allocator`). The
# processes tests start (notebook kernels, examples, the demo) get the same through glibc's
# environment variables.
allocator.keep_freed_memory()
for _name, _value in allocator.ENVIRONMENT.items():
    os.environ.setdefault(_name, _value)

# Under pytest-xdist (``-n 2 --dist loadfile`` in addopts) each worker takes one thread: two workers fill two
# cores; a file's tests stay on one worker, so module-level caches (the deep model's unit selection) hold.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, os.cpu_count() or 1)))
if os.environ.get("PYTEST_XDIST_WORKER"):
    # the processes tests start (notebook kernels, examples, the demo, distributed ranks) inherit it:
    # two threads each beside the other worker would oversubscribe the two cores
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


# ------------------------------------------------------------ shared fixtures
# The small retrieval task every model-level test file uses (8 residues, 64 tokens).
SMALL_TASK_SETTINGS = dict(seq_len=64, n_records=8, n_demos=2, min_distance=20, residue_modulus=8)
GATE_BIASES = ("b_k", "b_v", "position_bias")


def small_task():
    from phaseinterp.tasks import KeyValueRetrieval

    return KeyValueRetrieval(**SMALL_TASK_SETTINGS)


def make_model(config: dict, *, gate_seed: int = 3, randomize=GATE_BIASES, scale: float = 1.0):
    """A `CompressedTransformer` from ``config`` whose gate parameters named in ``randomize``
    (suffixes, or ``.Z_``-style substrings) are redrawn N(0, scale^2) from ``gate_seed``, so
    every gate path is exercised (fresh models have zero biases)."""
    from phaseinterp import CompressedConfig, CompressedTransformer

    model = CompressedTransformer(CompressedConfig(**config))
    gen = torch.Generator().manual_seed(gate_seed)
    suffixes = tuple(r for r in randomize if not r.startswith("."))
    parts = tuple(r for r in randomize if r.startswith("."))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if (suffixes and name.endswith(suffixes)) or any(part in name for part in parts):
                p.copy_(scale * torch.randn(p.shape, generator=gen))
    return model.eval()


@pytest.fixture(scope="session")
def task_small():
    """`small_task()` as a fixture."""
    return small_task()


@pytest.fixture
def one_thread():
    """One torch thread for the test (tiny tensors: one thread beats two fighting over a loaded machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------ shipped checkpoints
# `@pytest.mark.zoo("w4s4", "full")`: the test needs these shipped checkpoints. Missing ones skip
# the test on a developer's machine, but FAIL it under CI=true (`.ci/run`), so a release that lost
# a checkpoint cannot pass CI by skipping.
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def shipped_checkpoints() -> set[str]:
    """Names of every shipped checkpoint: the own zoo and the HF-format DeepSeek-V4 models."""
    from phaseinterp.models.catalog import available

    return set(available())


def pytest_runtest_setup(item):
    for mark in item.iter_markers("zoo"):
        missing = sorted(set(mark.args) - shipped_checkpoints())
        if missing:
            why = f"shipped checkpoint(s) {', '.join(missing)} missing (phaseinterp zoo list shows how to build them)"
            if CI:
                pytest.fail(f"{why}; under CI=true a missing checkpoint fails the run", pytrace=False)
            pytest.skip(why)


# The longest test files first (their summed seconds in one run: benchmarks/HISTORY.md, old section 20),
# so that under ``--dist loadfile`` neither worker starts a long file when the other is nearly done;
# the rest keep their collection order. Only the order changes: every test still runs. The order
# holds only with ``--no-loadscope-reorder`` (pyproject's addopts; pytest-xdist >= 3.8): by default
# xdist re-sorts the files by their NUMBER of tests, which sent the 7-test, 3-minute
# test_zoo_deep_claims.py to the end of the run while the other worker sat idle.
LONGEST_FIRST = ("test_zoo_deep_claims.py", "test_unit_cycling.py", "test_notebooks_examples.py", "test_cli.py",
                 "test_zoo.py", "test_report_page.py", "test_distributed.py", "test_hf_release.py",
                 "test_model.py", "test_deepseek_v4.py")


def _warn_if_reordered(config) -> None:
    """Called by pytest_configure (imported below from tests/interrupts.py, which also sets SIGTERM)."""
    if config.getoption("dist", "no") == "loadfile" and config.getoption("loadscopereorder", False):
        config.issue_config_time_warning(pytest.PytestConfigWarning(
            "xdist re-sorts the test files by their number of tests (--loadscope-reorder), so the longest files "
            "no longer run first (LONGEST_FIRST in tests/conftest.py); the suite takes longer"), stacklevel=2)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: within a file, the file's order


# Loaded zoo models and their profiles, shared by the whole test run (each loaded or measured once).
# Tests must leave a shared model as they found it (interventions are context managers that
# restore it); a test that changes a model for good loads its own copy.
@pytest.fixture(scope="session")
def zoo_model():
    """``zoo_model(name)``: the shipped model ``name``, loaded once per test run."""
    import phaseinterp as pi

    loaded: dict = {}

    def load(name: str):
        if name not in loaded:
            loaded[name] = pi.zoo.load(name)
        return loaded[name]

    return load


@pytest.fixture(scope="session")
def zoo_profile(zoo_model):
    """``zoo_profile(name, n_per_residue, seed=0)``: ``phase_profile`` of the shipped model ``name``
    on its own task, measured once per test run."""
    import phaseinterp as pi

    measured: dict = {}

    def profile(name: str, n_per_residue: int, seed: int = 0):
        key = (name, n_per_residue, seed)
        if key not in measured:
            model = zoo_model(name)
            measured[key] = pi.phase_profile(model, pi.zoo.task_for(model), n_per_residue=n_per_residue, seed=seed, progress=False)
        return measured[key]

    return profile


# Ctrl-C and SIGTERM stop the run and end the processes tests started (tests/interrupts.py).
from interrupts import pytest_sessionfinish, run_child  # noqa: E402,F401
from interrupts import pytest_configure as _interrupts_configure  # noqa: E402


def pytest_configure(config):
    _interrupts_configure(config)
    _warn_if_reordered(config)
