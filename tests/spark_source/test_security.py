"""The source's security options (Spark's Kafka source's names, without ``kafka.``): parsed at
planning time into the client's ``Security``, which every client of the query uses; and real
reads, batch and streaming, from a cluster with TLS on the client and peer ports and SCRAM
users (``SecureCluster``), as a user an ACL lets read the topic."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafkaesque.spark_source import OptionError
from kafkaesque.spark_source._options import Mode, parse_options
from kafkaesque.spark_source._read import ReadSettings
from pyspark.sql import SparkSession

from kafkaesque.client import Client, Producer, Security
from kafkaesque.local_cluster import DevSecurity, SecureCluster, write_users
from kafkaesque.protocol import AclOperation, AclPattern, AclPermission, AclResource, AclRow

BASE = {"bootstrap": "127.0.0.1:9092", "subscribe": "readings"}
TOPIC = "secure-readings"
READER, READER_PASSWORD = "spark", "spark-password"
RECORDS = 600


def _secure(ca: str, user: str = READER, password: str = READER_PASSWORD) -> dict[str, str]:
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": user,
        "sasl.password": password,
        "ssl.truststore.location": ca,
    }


# -- parsing ------------------------------------------------------------------------------------


def test_no_security_option_means_plaintext() -> None:
    assert parse_options(BASE).security is None
    assert parse_options(BASE).client_config().security.protocol == "PLAINTEXT"


def test_the_security_options_make_the_clients_security() -> None:
    options = parse_options({**BASE, **_secure("/etc/ca.pem")}, Mode.BATCH)
    assert options.security == Security(
        protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-256",
        username=READER,
        password=READER_PASSWORD,
        ssl_cafile="/etc/ca.pem",
    )
    assert options.client_config().security == options.security
    # It travels to the executors in the read settings, and the password shows in no repr.
    settings = ReadSettings.of(options)
    assert pickle.loads(pickle.dumps(settings)).security == options.security
    assert READER_PASSWORD not in repr(options) and READER_PASSWORD not in repr(settings)


def test_names_are_case_insensitive_and_hostname_checks_can_be_turned_off() -> None:
    given = {
        **BASE,
        "Security.Protocol": "SSL",
        "SSL.Truststore.Location": "/etc/ca.pem",
        "ssl.endpoint.identification.algorithm": "",
    }
    security = parse_options(given).security
    assert (security.protocol, security.ssl_cafile) == ("SSL", "/etc/ca.pem")
    assert security.ssl_check_hostname is False


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"kafka.sasl.username": "x"}, "'sasl.username'"),  # Spark's spelling: drop the prefix
        ({"kafka.security.protocol": "SSL"}, "'security.protocol'"),
        ({"ssl.trustore.location": "/ca.pem"}, "ssl.trustore.location"),  # a typo
        ({"security.protocol": "TLS"}, "security.protocol"),
        ({"security.protocol": "SASL_SSL", "sasl.username": "u"}, "password"),
        (
            {
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN",
                "sasl.username": "u",
                "sasl.password": "p",
            },
            "PLAIN",
        ),
    ],
)
def test_bad_security_options_fail_at_planning_naming_the_option(
    extra: dict[str, str], named: str
) -> None:
    with pytest.raises(OptionError, match=named.replace(".", r"\.")):
        parse_options({**BASE, **extra})


# -- reading from a secure cluster -----------------------------------------------------------


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SecureCluster, DevSecurity]]:
    """A cluster with TLS and SCRAM; ``admin`` (a super user) publishes, ``spark`` may read
    ``TOPIC`` (an ACL) and nothing else."""
    root = tmp_path_factory.mktemp("spark-secure")
    security = DevSecurity.make(str(root), username="admin")
    write_users(security.users_file, {"admin": security.password, READER: READER_PASSWORD})
    with SecureCluster(str(root / "cluster"), 3, security=security) as cluster:
        with Client(cluster.bootstrap, config=security.client_config()) as client:
            client.create_topic(TOPIC, 3, 3)
            client.add_acl(
                AclRow(
                    f"User:{READER}",
                    AclPermission.ALLOW,
                    AclOperation.READ,
                    AclResource.TOPIC,
                    AclPattern.LITERAL,
                    TOPIC,
                )
            )
            with Producer(client) as producer:
                for i in range(RECORDS):
                    producer.send(TOPIC, b"v%d" % i, b"k%d" % (i % 7))
                producer.flush()
        yield cluster, security


def test_a_batch_read_over_tls_as_a_scram_user(
    spark: SparkSession, secure: tuple[SecureCluster, DevSecurity]
) -> None:
    cluster, security = secure
    df = (
        spark.read.format("kafkaesque")
        .option("bootstrap", cluster.bootstrap)
        .option("subscribe", TOPIC)
        .options(**_secure(security.pki.ca))
        .load()
    )
    values = sorted(bytes(r.value) for r in df.select("value").collect())
    assert values == sorted(b"v%d" % i for i in range(RECORDS))


def test_a_streaming_read_over_tls_as_a_scram_user(
    spark: SparkSession, secure: tuple[SecureCluster, DevSecurity], tmp_path: Path
) -> None:
    cluster, security = secure
    stream = (
        spark.readStream.format("kafkaesque")
        .option("bootstrap", cluster.bootstrap)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .options(**_secure(security.pki.ca))
        .load()
    )
    query = (
        stream.writeStream.format("memory")
        .queryName("secure_stream")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    [row] = spark.sql("SELECT count(*) FROM secure_stream").collect()
    assert row[0] == RECORDS


def test_a_wrong_password_fails_the_query_with_auth_failed(
    spark: SparkSession, secure: tuple[SecureCluster, DevSecurity]
) -> None:
    cluster, security = secure
    df = (
        spark.read.format("kafkaesque")
        .option("bootstrap", cluster.bootstrap)
        .option("subscribe", TOPIC)
        .options(**_secure(security.pki.ca, password="wrong"))
        .load()
    )
    with pytest.raises(Exception, match="AUTH_FAILED"):
        df.count()


def test_a_plaintext_read_of_the_tls_port_fails(
    spark: SparkSession, secure: tuple[SecureCluster, DevSecurity]
) -> None:
    cluster, _ = secure
    df = (
        spark.read.format("kafkaesque")
        .option("bootstrap", cluster.bootstrap)
        .option("subscribe", TOPIC)
        .option("failoverTimeoutMs", "2000")
        .load()
    )
    with pytest.raises(Exception, match="TLS"):
        df.count()
