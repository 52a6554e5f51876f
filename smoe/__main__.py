"""``python -m smoe``: the same as the ``smoe`` command."""

import sys

from smoe.cli import main

if __name__ == "__main__":
    sys.exit(main())
