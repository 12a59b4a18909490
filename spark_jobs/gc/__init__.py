"""Uncommitted garbage collection on Spark: clean and optimized runs, a Great Expectations
gate before any delete, separable mark and sweep, saved runs, reports and `explain`.

Modules, in the order a run uses them: `config` (settings), `storage` (the namespace as
driver and executors see it), `layout` (which keys are data objects, which slices to list),
`committed` (addresses of every commit's ranges), `listing` (slices listed on the
executors), `marking` (the mark, slice by slice on the executors), `plan` (which objects a
run may delete, and the safety argument of the optimized run), `gate` (the GX suites),
`frames` (Parquet in and out through the executors), `sweep` (bulk deletes), `runs` (what a
run saves), `report` (the HTML page), `explain` (why an address was or was not collected),
`events` (what the job tells its launcher) and `job` (the driver, and the command line
`spark-submit` runs through `__main__`). The prepare run is the engine's
(`Repository.prepare_uncommitted_for_gc`).
"""
