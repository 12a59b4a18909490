"""`python -m branchwater.engine.cli`: the same entry point as the `branchwater` script."""

import sys

from branchwater.engine.cli.app import main

if __name__ == "__main__":
    sys.exit(main())
