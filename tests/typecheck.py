"""The runtime type checker the test suite installs on phaseinterp (see conftest.py).

beartype with PEP 484's implicit numeric tower: an ``int`` is accepted where a ``float`` is
annotated (``threshold=-50``), exactly as Python users expect.
"""

from beartype import BeartypeConf, beartype

typecheck = beartype(conf=BeartypeConf(is_pep484_tower=True))
