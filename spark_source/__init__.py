"""PySpark Python Data Source ``kafkaesque``: read topics by offset, batch and streaming.

::

    from kafkaesque.spark_source import register
    register(spark)                        # once per session
    df = (spark.read.format("kafkaesque")
          .option("bootstrap", "127.0.0.1:9092")
          .option("subscribe", "readings")
          .load())

Options and schema follow Spark's built-in Kafka source; see docs/spark.md. ``local_session()``
starts an embedded ``local[*]`` session with the source registered and the workers' Python set.
The source's two decoders are public too: ``arrow_batch`` and ``row_tuples`` turn the payload of
``kafkaesque.client.Client.fetch_batch`` into rows of its schema, without Spark.
Needs the ``spark`` extra (pyspark >= 4.0, pyarrow) and a Java runtime.
"""

from ._decode import CorruptDataError, arrow_batch, row_tuples
from ._offsets import DataLossError
from ._options import OptionError
from ._read import ReadStalledError
from ._schema import arrow_schema, spark_schema
from ._session import WorkerPythonError, local_session, register, stop_session, worker_python
from ._source import NAME, KafkaesqueBatchReader, KafkaesqueDataSource, KafkaesqueStreamReader

__all__ = [
    "NAME",
    "CorruptDataError",
    "DataLossError",
    "KafkaesqueBatchReader",
    "KafkaesqueDataSource",
    "KafkaesqueStreamReader",
    "OptionError",
    "ReadStalledError",
    "WorkerPythonError",
    "arrow_batch",
    "arrow_schema",
    "local_session",
    "register",
    "row_tuples",
    "spark_schema",
    "stop_session",
    "worker_python",
]
