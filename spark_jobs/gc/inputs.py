"""The address sets a run reads besides its listing: the committed addresses of new ranges,
the uncommitted addresses (the prepare output) and the base run's carry and pending sets.

A mark on the executors has them read and packed there (see `packing`), one on the driver
reads them as Arrow tables (see `mark_on_driver`). The gate reads the committed,
uncommitted and carried sets again to check that no candidate is referenced (after a mark on
the executors: the range readers' scratch files and the sets' own files; after one on the
driver: the tables it read), and validates the uncommitted set as a DataFrame either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from branchwater.engine import UncommittedRun
from branchwater.engine.gc.runs import plan
from branchwater.engine.gc.runs.files import RunSummary
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.spark_jobs.gc.committed import CommittedInput
from branchwater.spark_jobs.gc.frames import arrow_schema, read_parquet
from branchwater.spark_jobs.gc.marking import SET_DDL, arrow_addresses_read
from branchwater.spark_jobs.gc.packing import packed_files

REFERENCED = (plan.UNCOMMITTED, plan.CARRIED)
"""The sets read from files whose addresses a branch or a commit references (the base
run's pending addresses were referenced by neither when it read them)."""


@dataclass(frozen=True)
class SetFiles:
    """The files of one set, with their columns (DDL)."""

    keys: list[str]
    ddl: str

    @property
    def schema(self) -> pa.Schema:
        return arrow_schema(self.ddl)


class SetsRead:
    """One run's sets, by their bit in `plan`; `committed` is set once read. Where the
    executors read a set's files, at most `readers` tasks do (one per core, as for the
    ranges: see `committed.read_committed`)."""

    def __init__(
        self,
        spark: SparkSession,
        ns: Namespace,
        prepared: UncommittedRun,
        base: RunSummary | None,
        readers: int,
    ) -> None:
        self.spark = spark
        self.ns = ns
        self.readers = readers
        self.files = {plan.UNCOMMITTED: SetFiles(list(prepared.keys), "address string, size long")}
        if base is not None:
            self.files[plan.CARRIED] = SetFiles(base.files.get("carry", []), "address string")
            self.files[plan.PENDING] = SetFiles(base.files.get("pending", []), SET_DDL)
        self.committed: CommittedInput | None = None
        self._tables: dict[int, pa.Table] | None = None
        self._rows: dict[int, int] = {}

    def frame(self, bit: int) -> DataFrame:
        """One set as a DataFrame reading its files."""
        files = self.files[bit]
        return read_parquet(self.spark, self.ns, files.keys, files.ddl, self.readers)

    def frames_read(self) -> list[DataFrame]:
        """Every set packed for a mark on the executors (see `packing`)."""
        read = [self._committed().packed()]
        for bit, files in self.files.items():
            read.append(
                packed_files(self.spark, self.ns, files.keys, files.schema, bit, self.readers)
            )
        return read

    def referenced_keys(self) -> list[str]:
        """The files of the `REFERENCED` sets (the committed addresses are the gate's own
        scratch files)."""
        return [key for bit in REFERENCED if bit in self.files for key in self.files[bit].keys]

    def small(self, most: int) -> bool:
        """Whether the committed addresses were read on the driver and all sets hold at most
        `most` rows together (counted from the files' footers)."""
        read = self._committed().on_driver
        if read is None:
            return False
        rows = read.num_rows
        for bit in self.files:
            rows += self.rows(bit)
            if rows > most:
                return False
        return True

    def rows(self, bit: int) -> int:
        """How many addresses one set's files hold, from their footers."""
        if bit not in self._rows:
            self._rows[bit] = self.ns.parquet_rows(self.files[bit].keys)
        return self._rows[bit]

    def tables(self) -> list[pa.Table]:
        """`arrow_addresses_read` tables of every set, for a mark on the driver."""
        return [arrow_addresses_read(table, bit) for bit, table in self._read_here().items()]

    def referenced_tables(self) -> list[pa.Table]:
        """The committed and `REFERENCED` sets as read, for the gate."""
        wanted = (plan.NEW_COMMITTED, *REFERENCED)
        return [table for bit, table in self._read_here().items() if bit in wanted]

    def _read_here(self) -> dict[int, pa.Table]:
        """Every set read on the driver, once."""
        if self._tables is None:
            read = self._committed().on_driver
            assert read is not None, "the committed addresses were read on the executors"
            self._tables = {plan.NEW_COMMITTED: read}
            for bit, files in self.files.items():
                self._tables[bit] = self.ns.read_table(files.keys, files.schema)
        return self._tables

    def _committed(self) -> CommittedInput:
        if self.committed is None:
            raise RuntimeError("the committed addresses are not read yet")
        return self.committed
