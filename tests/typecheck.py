"""The runtime type checker the test suite installs on phaseinterp (see conftest.py).

beartype with PEP 484's implicit numeric tower: an ``int`` is accepted where a ``float`` is
annotated (``threshold=-50``), exactly as Python users expect.
"""

from contextlib import contextmanager

from beartype import BeartypeConf, beartype
from jaxtyping import config as jaxtyping_config

typecheck = beartype(conf=BeartypeConf(is_pep484_tower=True))


@contextmanager
def as_user():
    """Calls as a user makes them: without this runtime type hook, whose own TypeCheckError would stand
    in front of the package's checks (a wrong-type value must reach them)."""
    jaxtyping_config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        jaxtyping_config.update("jaxtyping_disable", False)
