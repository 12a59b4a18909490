"""Airflow's REST API, as the stack's tests drive it."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass


@dataclasses.dataclass
class AirflowClient:
    """Airflow's public REST API (/api/v2) with a JWT from /auth/token, as a user would call it."""

    base_url: str
    username: str
    password: str
    _token: str = ""

    def _headers(self) -> dict[str, str]:
        import httpx

        if not self._token:
            response = httpx.post(
                f"{self.base_url}/auth/token",
                json={"username": self.username, "password": self.password},
                timeout=30,
            )
            response.raise_for_status()
            self._token = response.json()["access_token"]
        return {"Authorization": f"Bearer {self._token}"}

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        response = httpx.request(
            method, f"{self.base_url}/api/v2{path}", headers=self._headers(), timeout=30, **kwargs
        )
        response.raise_for_status()
        return response.json()

    def wait_for_dag(self, dag_id: str, timeout: float) -> None:
        """Until the DAG processor has parsed `dag_id`."""
        import httpx

        deadline = time.monotonic() + timeout
        while True:
            try:
                self.request("GET", f"/dags/{dag_id}")
                return
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(1)

    def unpause(self, dag_id: str) -> None:
        self.request("PATCH", f"/dags/{dag_id}", json={"is_paused": False})

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> str:
        run = self.request(
            "POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf}
        )
        return str(run["dag_run_id"])

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float) -> str:
        """The run's final state (`success` or `failed`)."""
        deadline = time.monotonic() + timeout
        while True:
            state = str(self.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"])
            if state in ("success", "failed") or time.monotonic() > deadline:
                return state
            time.sleep(2)

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        """Each task instance's state, keyed `task_id[map_index]`."""
        instances = self.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
        return {
            f"{ti['task_id']}[{ti.get('map_index', -1)}]": str(ti["state"])
            for ti in instances["task_instances"]
        }

    def failed_tasks(self, dag_id: str, run_id: str) -> list[str]:
        states = self.task_states(dag_id, run_id)
        return [
            f"{task}: {state}"
            for task, state in states.items()
            if state not in ("success", "skipped")
        ]


GC_TASKS = ("prepare", "mark", "gate", "sweep", "report")
"""The tasks of the GC DAGs (`dags/branchwater_gc.py`), in order."""
