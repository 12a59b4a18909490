"""`spark-submit …/spark_jobs/gc/__main__.py ARGS` (or `python -m branchwater.spark_jobs.gc`).

Run as a file, Python puts this folder first on `sys.path`, where the job's module names
(`config`, `plan`, `report`, …) would shadow any top-level module a library imports under
the same name; the folder is taken off again before anything else is imported.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

from branchwater.spark_jobs.gc.arguments import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
