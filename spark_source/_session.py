"""Registering the source with a Spark session, and the embedded local session of the examples.

The trap this guards against: Spark runs a Python data source in worker processes started with
the interpreter named by ``$PYSPARK_PYTHON`` when the ``SparkContext`` was created (else
``python3`` from the PATH; the ``spark.pyspark.python`` setting does not reach data sources). A
worker that cannot import ``kafkaesque`` fails every query with a long unpickling traceback.
``register`` checks the interpreter once, in local mode, and says what to set instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from ._source import KafkaesqueDataSource

_IMPORT_CHECK_TIMEOUT_S = 60


class WorkerPythonError(RuntimeError):
    """Spark's Python workers would run an interpreter that cannot import kafkaesque."""


def worker_python(spark: SparkSession) -> str:
    """The interpreter Spark starts the source's Python workers with."""
    return str(spark.sparkContext.pythonExec)


def register(spark: SparkSession, *, check_workers: bool = True) -> None:
    """Make ``format("kafkaesque")`` available in ``spark``.

    With ``check_workers`` and a local master, first check that the workers' interpreter imports
    ``kafkaesque.spark_source`` (``WorkerPythonError`` naming it otherwise). On a cluster the
    executors' interpreter is not visible from here: install kafkaesque there.
    """
    if check_workers and (spark.sparkContext.master or "").startswith("local"):
        python = worker_python(spark)
        try:
            subprocess.run(
                [python, "-c", "import kafkaesque.spark_source"],
                check=True,
                capture_output=True,
                timeout=_IMPORT_CHECK_TIMEOUT_S,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            last = detail.decode(errors="replace").strip().splitlines()[-1:] or [str(exc)]
            raise WorkerPythonError(
                f"Spark's Python workers run {python!r}, which cannot import "
                f"kafkaesque.spark_source ({last[0]}); set PYSPARK_PYTHON to an interpreter "
                f"that has kafkaesque (e.g. {sys.executable}) before the session starts"
            ) from exc
    spark.dataSource.register(KafkaesqueDataSource)


def local_session(
    app_name: str = "kafkaesque",
    *,
    master: str = "local[*]",
    shuffle_partitions: int = 4,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A Spark session in local mode for examples, tests and benchmarks, source registered.

    Its workers run this interpreter, which has kafkaesque (it sets ``$PYSPARK_PYTHON``, which
    must happen before the first session of the process starts); it binds to loopback, the UI is
    off, and shuffles use ``shuffle_partitions`` partitions (Spark's 200 are for clusters);
    ``conf`` adds settings. Stop it with ``stop_session`` (``spark.stop()`` leaves the JVM up).
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark, check_workers=worker_python(spark) != sys.executable)
    return spark


def stop_session(spark: SparkSession, timeout_s: float = 30.0) -> None:
    """Stop ``spark`` and the JVM this process started for it.

    ``spark.stop()`` alone leaves the JVM running until Python exits; tests and benchmarks that
    must not leave processes behind use this. The JVM exits when the pipe to its stdin closes
    (PySpark launches it so); it is killed if it has not after ``timeout_s``.
    """
    from pyspark import SparkContext

    spark.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if proc is not None:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
