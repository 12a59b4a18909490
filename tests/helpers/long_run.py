"""Whether this is the long run (`BRANCHWATER_LONG_TESTS=1`, hours): more examples, seeds,
rounds and bytes than a CI run, for the tests that scale with it."""

from __future__ import annotations

import os

LONG_TESTS = os.environ.get("BRANCHWATER_LONG_TESTS") == "1"
