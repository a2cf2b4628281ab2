"""Test set-up: jaxtyping runtime shape checks on every phaseinterp function, fixed seeds."""

import os

os.environ.setdefault("PHASEINTERP_NO_PROGRESS", "1")

from jaxtyping import install_import_hook  # noqa: E402

# Must run before anything imports phaseinterp: every annotated function is then checked.
# `import phaseinterp` is lazy (the CLI's --help must not wait for torch), so import the core
# modules here, inside the hook: the ones `import phaseinterp` used to load eagerly.
with install_import_hook("phaseinterp", "typecheck.typecheck"):
    import importlib

    for _module in ("config", "phase", "stats", "tasks", "results", "profile", "evaluate", "models",
                    "interventions", "zoo"):
        importlib.import_module(f"phaseinterp.{_module}")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
