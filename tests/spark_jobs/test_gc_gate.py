"""The gate's sizing of the frames it validates (its suites run in every GC test)."""

from __future__ import annotations

import pytest

from branchwater.spark_jobs.gc.gate import ROWS_PER_PARTITION, validation_partitions


@pytest.mark.parametrize(
    ("rows", "cores", "partitions"),
    [
        (0, 2, 1),
        (500, 2, 1),
        (ROWS_PER_PARTITION, 8, 1),
        (ROWS_PER_PARTITION + 1, 8, 2),
        (10 * ROWS_PER_PARTITION, 8, 8),
        (10 * ROWS_PER_PARTITION, 2, 2),
    ],
)
def test_a_frame_is_validated_in_a_partition_per_share_of_rows_up_to_one_per_core(
    rows: int, cores: int, partitions: int
) -> None:
    assert validation_partitions(rows, cores) == partitions
