"""PySpark jobs: uncommitted GC clean and optimized runs, with their data-quality suites."""
