"""One smoke test per shared fixture: each real part of the stack does real work once.

When these pass, a failure elsewhere is about Branchwater, not about the machine: the
PostgreSQL server, the SeaweedFS S3 server, moto's DynamoDB server, the Spark session, the
Airflow metadata DB and Great Expectations on Spark all work here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.fixtures.s3 import S3Server
from tests.helpers.servers import unique_name

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.mark.postgres
def test_postgres_round_trips_a_row(postgres_url: str) -> None:
    import psycopg

    with psycopg.connect(postgres_url, connect_timeout=5) as conn:
        conn.execute("CREATE TEMPORARY TABLE smoke (k text PRIMARY KEY, v bytea NOT NULL)")
        conn.execute("INSERT INTO smoke VALUES (%s, %s)", ("key", b"\x00value\xff"))
        row = conn.execute("SELECT v FROM smoke WHERE k = %s", ("key",)).fetchone()
    assert row == (b"\x00value\xff",)


@pytest.mark.s3
def test_seaweedfs_stores_an_object(s3_server: S3Server, s3_bucket: str) -> None:
    client = s3_server.client()
    client.put_object(Bucket=s3_bucket, Key="smoke/object", Body=b"payload")
    assert client.get_object(Bucket=s3_bucket, Key="smoke/object")["Body"].read() == b"payload"
    listed = client.list_objects_v2(Bucket=s3_bucket)["Contents"]
    assert [(o["Key"], o["Size"]) for o in listed] == [("smoke/object", 7)]


@pytest.mark.s3
def test_seaweedfs_checks_signatures(s3_server: S3Server, s3_bucket: str) -> None:
    """Like AWS, the server refuses a wrong secret and unsigned requests."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import ClientError

    wrong = {**s3_server.options, "aws_secret_access_key": "not-" + s3_server.secret_key}
    clients = [
        boto3.session.Session().client("s3", **wrong),
        boto3.session.Session().client(
            "s3", config=Config(signature_version=UNSIGNED), **s3_server.options
        ),
    ]
    for client in clients:
        with pytest.raises(ClientError) as refused:
            client.list_objects_v2(Bucket=s3_bucket)
        assert refused.value.response["Error"]["Code"] in ("SignatureDoesNotMatch", "AccessDenied")


@pytest.mark.s3
def test_moto_serves_dynamodb(dynamodb_endpoint: str) -> None:
    import boto3

    client = boto3.client("dynamodb", endpoint_url=dynamodb_endpoint, region_name="us-east-1")
    table = unique_name("smoke-")
    client.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client.put_item(TableName=table, Item={"k": {"S": "key"}, "v": {"B": b"\x00value"}})
    item = client.get_item(TableName=table, Key={"k": {"S": "key"}})["Item"]
    assert item["v"]["B"] == b"\x00value"


@pytest.mark.spark
@pytest.mark.slow
def test_spark_computes_an_aggregate(spark: SparkSession) -> None:
    from pyspark.sql import functions as F

    frame = spark.range(1, 101).withColumn("parity", F.col("id") % 2)
    totals = {
        r["parity"]: r["total"]
        for r in frame.groupBy("parity").agg(F.sum("id").alias("total")).collect()
    }
    assert totals == {0: 2550, 1: 2500}
    assert spark.sparkContext.master == "local[2]"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"


@pytest.mark.airflow
@pytest.mark.slow
def test_airflow_runs_a_dag_that_uses_the_engine(airflow_home: Path) -> None:
    from airflow.sdk import DAG, DagRunState, task

    from branchwater.demo.dag_run import register

    @task
    def kv_round_trip() -> str:
        import tempfile

        from branchwater.engine import Lake

        with tempfile.TemporaryDirectory() as namespace, Lake.connect("memory://") as lake:
            main = lake.create_repository("smoke", Path(namespace).as_uri()).branch("main")
            main.upload("smoke/key", b"branchwater-ok")
            return main.read("smoke/key").decode()

    @task
    def confirm(value: str) -> str:
        return f"engine ok: {value}"

    with DAG("bw_harness", schedule=None) as dag:
        confirm(kv_round_trip())
    register(dag)
    run = dag.test()
    assert run.state == DagRunState.SUCCESS
    assert _return_values(run.dag_id, run.run_id) == {
        "kv_round_trip": "branchwater-ok",
        "confirm": "engine ok: branchwater-ok",
    }
    assert (airflow_home / "airflow.db").is_file()


def _return_values(dag_id: str, run_id: str) -> dict[str, Any]:
    """Each task's `return_value` XCom, read back from the metadata DB."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    query = XComModel.get_many(run_id=run_id, dag_ids=dag_id, key="return_value")
    with create_session() as session:
        return {x.task_id: XComModel.deserialize_value(x) for x in session.scalars(query)}


@pytest.mark.spark
@pytest.mark.slow
def test_great_expectations_validates_a_spark_dataframe(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx

    frame = spark.createDataFrame(
        [("data/a", 1), ("data/b", 5), ("data/b", 9)], schema="address string, age int"
    )
    context = gx.get_context(mode="ephemeral")
    asset = context.data_sources.add_spark(name="spark").add_dataframe_asset(name="candidates")
    batch = asset.add_batch_definition_whole_dataframe("whole").get_batch(
        batch_parameters={"dataframe": frame}
    )
    suite = gx.ExpectationSuite(
        name="smoke",
        expectations=[
            gx.expectations.ExpectColumnValuesToBeBetween(column="age", min_value=0, max_value=10),
            gx.expectations.ExpectColumnValuesToBeUnique(column="address"),
        ],
    )
    result = batch.validate(suite)
    outcomes = {r.expectation_config.type: r.success for r in result.results}
    assert outcomes == {
        "expect_column_values_to_be_between": True,
        "expect_column_values_to_be_unique": False,
    }
    assert result.success is False
