"""A partition leader killed (kill -9) while Spark reads: the read still returns the exact range.

A cluster of its own (the test kills one of its brokers). Fetches are kept small so the read
takes many round trips; the leader of partition 0 dies once the Spark job is running, and the
tasks go on through the new leader or any replica.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pyspark.sql import SparkSession

from kafkaesque.client import Client
from kafkaesque.local_cluster import LocalCluster

from .conftest import publish, read, rows_by_offset


def test_a_leader_killed_during_a_batch_read(spark: SparkSession, tmp_path: Path) -> None:
    with LocalCluster(str(tmp_path), 3) as cluster:
        published = publish(cluster.bootstrap, "failover", 20_000, value_size=100)
        with Client(cluster.bootstrap) as client:
            leader = client.describe_topic("failover").partitions[0].leader
        assert leader is not None
        df = read(spark, cluster.bootstrap, subscribe="failover", fetchMaxBytes="32768")
        with ThreadPoolExecutor(1) as pool:
            reading = pool.submit(rows_by_offset, df)
            tracker = spark.sparkContext.statusTracker()
            deadline = time.monotonic() + 60
            while not tracker.getActiveJobsIds() and not reading.done():
                assert time.monotonic() < deadline, "the Spark job did not start"
                time.sleep(0.05)
            cluster.kill(leader)
            killed_while_reading = not reading.done()
            got = reading.result(timeout=180)
    assert killed_while_reading
    assert got == published
