"""``python -m phaseinterp.cli``: the command line (`phaseinterp.cli.main`)."""

import sys

from phaseinterp.cli import main

sys.exit(main())
