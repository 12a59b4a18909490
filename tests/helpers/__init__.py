"""Helpers the tests share, by domain: `servers` (names, ports, servers, spawned processes),
`races` (read-after-write across processes), `committed` (committed-layer data), `cli` (the
in-process CLI runner), `gc` (GC runs and the job in-process), `airflow` (its REST API),
`failpoints` (holding an operation at one), `views` (what a ref lists), `hostile` (nothing
written, secrets, hostile texts and dumps), `long_run` (whether this is the long run). Import
from the domain module; fixtures live in `tests/conftest.py` and the plugins under
`tests/fixtures/`."""
