"""The production-like stack: `make stack` natively, `docker/compose.yaml` in containers.

PostgreSQL (Airflow's metadata and the Branchwater KV), SeaweedFS's S3 server (the lake's
namespace), a Spark standalone master and worker, and Airflow 3.3 as separate processes
(api-server, scheduler with LocalExecutor, DAG processor, triggerer) running `dags/`.
`config` describes it once for both; `native` runs it here:

    handle = start(StackConfig())   # URLs, admin login, pids
    stop(handle)                    # every process it started, by pid
"""

from branchwater.stack import processes
from branchwater.stack.config import Ports, StackConfig
from branchwater.stack.native import StackError, StackHandle, start, stop, stop_state_dir

__all__ = [
    "Ports",
    "StackConfig",
    "StackError",
    "StackHandle",
    "processes",
    "start",
    "stop",
    "stop_state_dir",
]
