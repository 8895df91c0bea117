"""The driver of the exactly-once test (tests/peers/test_spark_kafka.py), a process of its own so
the test can kill it with kill -9 and start it again from its checkpoint.

    python tests/peers/spark_kafka_driver.py BOOTSTRAP TOPIC OUTPUT CHECKPOINT SECONDS

A Structured Streaming query: Spark's Kafka source over ``TOPIC`` (from the earliest offsets on
its first run; later runs resume from the checkpoint) into a Parquet file sink at ``OUTPUT``,
checkpointed at ``CHECKPOINT``, one micro-batch a second. It prints ``started`` once the query
runs and stops by itself after ``SECONDS`` (a bound: the test normally kills it first).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from kafkaesque.spark_source import stop_session

from bench._spark_kafka_read import spark_kafka_session


def main(argv: list[str]) -> int:
    bootstrap, topic, output, checkpoint, seconds = argv
    spark = spark_kafka_session("spark-kafka-exactly-once")
    spark.sparkContext.setLogLevel("WARN")  # the Kafka client's warnings, for a failure's log
    try:
        query = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("failOnDataLoss", "true")
            # A killed leader: fail over within seconds rather than Kafka's 30 s / 60 s defaults.
            .option("kafka.request.timeout.ms", "5000")
            .option("kafka.default.api.timeout.ms", "10000")
            .option("kafka.reconnect.backoff.max.ms", "500")
            .option("fetchOffset.numRetries", "20")
            .option("fetchOffset.retryIntervalMs", "500")
            .load()
            .selectExpr("CAST(value AS STRING) AS value", "partition", "offset")
            .writeStream.format("parquet")
            .option("path", output)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="1 second")
            .start()
        )
        print("started", flush=True)
        query.awaitTermination(int(seconds))
        query.stop()
    finally:
        stop_session(spark)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
