"""The history checker (issue 43): many processes run random operations against one
repository, log every invocation and completion, and a pure checker validates the merged
history and the final state against a model of the README's guarantees.

Cross-cutting, so it mirrors no module of the code: it exercises writes, deletes, copies,
links, commits, merges, reverts, resets, compactions, branches, tags, uncommitted and
retention GC and hostile names, paths and metadata together, on SQLite + local files and on
PostgreSQL + SeaweedFS, with failpoints firing in a share of the operations. `operations` is
what a worker process does and logs, `workers` the supervisor that restarts killed workers,
`runner` one history from a seed (set-up, run, final GC, the final state read back),
`checker` the model and the checks.
"""
