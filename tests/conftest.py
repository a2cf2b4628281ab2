"""Test set-up: jaxtyping runtime shape checks on every phaseinterp function, fixed seeds."""

import os

os.environ.setdefault("PHASEINTERP_NO_PROGRESS", "1")

from jaxtyping import install_import_hook  # noqa: E402

# Must run before anything imports phaseinterp: every annotated function is then checked.
# `import phaseinterp` is lazy, so import every submodule here, inside the hook.
with install_import_hook("phaseinterp", "typecheck.typecheck"):
    import importlib
    import pkgutil

    import phaseinterp

    for _module in pkgutil.walk_packages(phaseinterp.__path__, "phaseinterp."):
        importlib.import_module(_module.name)

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
