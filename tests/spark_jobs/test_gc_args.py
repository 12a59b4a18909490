"""The job's command line: the KV URL from the environment (`--kv-env`) and a prepare run
made beforehand (`--prepare-run`), as the Airflow GC DAGs call it."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from branchwater.engine import InvalidArgument
from branchwater.engine.gc.runs.config import JobConfig
from branchwater.engine.gc.runs.events import parse
from branchwater.spark_jobs.gc.arguments import main, parse_args

URL = "postgresql://gc:secret@db/lake"
JOB = Path(__file__).resolve().parents[2] / "spark_jobs" / "gc" / "__main__.py"


def test_the_kv_url_can_come_from_an_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKE_URL", URL)
    config = parse_args(["--kv-env", "LAKE_URL", "--repo", "sales", "--prepare-run", "r1"])
    assert (config.kv_url, config.repository, config.prepare_run) == (URL, "sales", "r1")
    assert parse_args(["--kv", URL, "--repo", "sales"]).prepare_run is None


def test_an_unset_variable_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAKE_URL", raising=False)
    with pytest.raises(InvalidArgument, match="the environment variable LAKE_URL is not set"):
        parse_args(["--kv-env", "LAKE_URL", "--repo", "sales"])


def test_one_source_of_the_kv_url_and_no_prepare_run_for_a_sweep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LAKE_URL", URL)
    with pytest.raises(InvalidArgument, match="not allowed with argument"):
        parse_args(["--kv", URL, "--kv-env", "LAKE_URL", "--repo", "sales"])
    with pytest.raises(InvalidArgument, match="one of the arguments --kv --kv-env is required"):
        parse_args(["--repo", "sales"])
    with pytest.raises(InvalidArgument, match="takes no prepare run"):
        parse_args(["--kv", URL, "--repo", "s", "--sweep", "r1", "--prepare-run", "r1"])


def test_driver_rows_bound_the_marks_on_the_driver() -> None:
    assert parse_args(["--kv", URL, "--repo", "s", "--driver-rows", "0"]).driver_rows == 0
    with pytest.raises(InvalidArgument, match="driver rows must not be negative"):
        parse_args(["--kv", URL, "--repo", "s", "--driver-rows", "-1"])


def test_a_run_takes_at_least_one_partition() -> None:
    assert parse_args(["--kv", URL, "--repo", "s", "--partitions", "1"]).partitions == 1
    for partitions in ("0", "-1"):
        with pytest.raises(InvalidArgument, match="partitions must be at least 1"):
            parse_args(["--kv", URL, "--repo", "s", "--partitions", partitions])


def test_the_job_settings_given_as_durations_stay_within_a_century() -> None:
    """The job parses its durations; a launcher that builds `JobConfig` itself is held to
    the same bounds (dates a run computes from them would otherwise leave the calendar)."""
    base = ["--kv", URL, "--repo", "s"]
    assert parse_args([*base, "--late-writes", "36500d"]).late_writes == timedelta(days=36_500)
    with pytest.raises(InvalidArgument, match="'36501d' is longer than 36500d"):
        parse_args([*base, "--late-writes", "36501d"])
    for name, value in [
        ("min_age", timedelta(days=-1)),
        ("min_age", timedelta(days=36_501)),
        ("late_writes", timedelta(seconds=-1)),
        ("lock_ttl", timedelta(0)),
    ]:
        with pytest.raises(InvalidArgument, match="must be a duration"):
            JobConfig(URL, "s", **{name: value})


def test_a_run_lease_lasts_at_least_a_second() -> None:
    with pytest.raises(InvalidArgument, match="at least 1 s"):
        JobConfig(URL, "s", lock_ttl=timedelta(milliseconds=1))


def test_a_usage_error_is_an_error_event_for_the_launcher(capsys: pytest.CaptureFixture) -> None:
    """The CLI and the Airflow operators read the job's events, not Spark's stderr."""
    assert main(["--kv", URL, "--repo", "sales", "--min-age", "abc"]) == 1
    events = [parse(line) for line in capsys.readouterr().out.splitlines()]
    assert events == [
        {
            "event": "error",
            "kind": "InvalidArgument",
            "message": "branchwater-gc: argument --min-age: "
            "'abc' is not a duration such as 90s, 30m, 6h or 2d",
        }
    ]


def test_only_one_part_of_a_run() -> None:
    assert parse_args(["--kv", URL, "--repo", "s"]).only is None
    assert parse_args(["--kv", URL, "--repo", "s", "--only", "committed"]).only == "committed"
    with pytest.raises(InvalidArgument, match="invalid choice"):
        parse_args(["--kv", URL, "--repo", "s", "--only", "everything"])


@pytest.mark.parametrize(
    ("args", "status", "said"),
    [(["--help"], 0, "--prepare-run RUN_ID"), (["--repo", "s"], 1, '"InvalidArgument"')],
)
def test_help_and_usage_errors_need_no_spark(args: list[str], status: int, said: str) -> None:
    """A host without the `spark` extra still reads the job's usage: pyspark is imported
    only once the arguments parse."""
    blocked = "import sys, runpy; sys.modules['pyspark'] = None; sys.argv = sys.argv[1:]; "
    script = blocked + "runpy.run_path(sys.argv[0], run_name='__main__')"
    done = subprocess.run(
        [sys.executable, "-c", script, str(JOB), *args], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stderr) == (status, ""), done.stderr
    assert said in done.stdout
