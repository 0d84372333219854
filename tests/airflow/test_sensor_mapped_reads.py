"""A sensor per table after mapped reads: each mapped sensor follows the read of its own map index."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_bos.airflow_compat import AirflowFailException
from airflow_provider_bos.sensors.completeness import BosCompletenessSensor

RUN_IDS = ["run-a", "run-b", "run-c"]  # what reads with map indexes 0, 1, 2 published


class _MappedReadsTI:
    """xcom_pull as the Task SDK answers it when ``sync`` is mapped over three tables."""

    def __init__(self, map_index: int) -> None:
        self.map_index = map_index

    def xcom_pull(self, *, task_ids: str, key: str, map_indexes: Any = None) -> Any:
        assert (task_ids, key) == ("sync", "bos_run_id")
        return list(RUN_IDS) if map_indexes is None else RUN_IDS[map_indexes]


def _sensor() -> BosCompletenessSensor:
    return BosCompletenessSensor(task_id="check", destination_conn_id="warehouse", sync_task_id="sync")


@pytest.mark.parametrize("map_index", [0, 1, 2])
def test_a_mapped_sensor_follows_the_read_of_its_own_map_index(map_index: int) -> None:
    assert _sensor()._sync_run_id(_MappedReadsTI(map_index)) == RUN_IDS[map_index]


def test_an_unmapped_sensor_after_mapped_reads_says_how_to_fix_the_dag() -> None:
    with pytest.raises(AirflowFailException, match="map this sensor over the same list"):
        _sensor()._sync_run_id(_MappedReadsTI(-1))
