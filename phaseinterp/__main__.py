"""``python -m phaseinterp`` (and ``torchrun -m phaseinterp``): the command line, `phaseinterp.cli`."""

import sys

from phaseinterp.cli import main

if __name__ == "__main__":
    sys.exit(main())
