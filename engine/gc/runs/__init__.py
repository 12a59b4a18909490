"""A GC run's files, without Spark: where they are (`layout`), the summary and statuses
(`files`), how they are read and written (`storage`), the job's settings and events
(`config`, `events`), the optimized run's plan and its proof (`plan`), the report
(`report`), `explain`, and the sweep of a mark with nothing to delete (`sweeps`).

The Spark job (`branchwater.spark_jobs.gc`), the CLI and the provider's view all use this
library; it is the public seam between the engine and the job, beside `branchwater.engine`.
"""
