"""`python -m branchwater.demo` (`make demo`): run the main job and say what it did."""

import sys

from branchwater.demo.main_job import main

if __name__ == "__main__":
    sys.exit(main())
