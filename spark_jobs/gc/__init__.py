"""Uncommitted garbage collection on Spark: what of a run runs on Spark.

Modules, in the order a run uses them: `committed` (addresses of every commit's ranges),
`listing` (slices listed on the executors), `marking` (the mark's task, slice by slice), run
by `mark_on_executors` or `mark_on_driver` as `mark_paths` chooses, `packing` (addresses
crossing the shuffle as Arrow streams), `inputs` (the sets a mark reads), `gate` (the GX
suites), `frames` (Parquet in and out through the executors), `sweep` (bulk deletes) and
`job` (the driver, and the command line `spark-submit` runs through `__main__`). Everything
else a run reads and writes (its settings, layout, summary, plan, report, `explain`) is the
engine's `branchwater.engine.gc.runs`, which needs no Spark; the prepare run is the
engine's too (`Repository.prepare_uncommitted_for_gc`).
"""
