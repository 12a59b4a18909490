"""Branchwater: git for a data lake, run from Airflow.

The distribution's code lives in the repository's top-level folders (`engine/`, `plugin/`,
`spark_jobs/`); `src/branchwater/` links them under their import names so that installers,
type checkers and IDEs resolve `branchwater.engine` and friends as plain packages.
"""
