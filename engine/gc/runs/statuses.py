"""A GC run's statuses, in a module that imports nothing: DAG files name them while Airflow
parses them, when nothing heavy may load."""

MARKED = "marked"
"""The mark finished and its gate passed; nothing is deleted yet (a dry run stops here)."""
GATE_FAILED = "gate_failed"
"""The gate failed: the mark is never swept."""
SWEPT = "swept"
"""The sweep finished: the run is a base for the next optimized run."""
FAILED = "failed"
"""The mark did not finish."""
