"""The client library against real brokers with TLS on the client and peer ports and a users file
(issue 25): every connection a client opens (to whichever broker leads) does TLS then SCRAM, the
producer's and consumer's I/O runs over TLS, ACLs are managed through the client, and a wrong
password, an untrusted CA or a plaintext client are refused without retrying forever."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trustme

from kafkaesque.client import (
    AsyncClient,
    AsyncConsumer,
    Client,
    ClientConfig,
    Consumer,
    KafkaesqueError,
    Producer,
    ProducerConfig,
    RetryPolicy,
    Security,
    open_producer,
)
from kafkaesque.local_cluster import DevSecurity, SecureCluster
from kafkaesque.protocol import (
    AclOperation,
    AclPattern,
    AclPermission,
    AclResource,
    AclRow,
    ErrorCode,
)
from kafkaesque.security import derive_credential as derive
from kafkaesque.security import load_users, save_users

FEW_RETRIES = RetryPolicy(max_attempts=2, backoff_ms=10, backoff_max_ms=10)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SecureCluster, DevSecurity]]:
    root = tmp_path_factory.mktemp("secure-client")
    security = DevSecurity.make(str(root), username="admin")
    users = load_users(security.users_file)
    users["carol"] = derive("carol-pw")  # no super user: ACLs apply to her
    save_users(security.users_file, users)
    with SecureCluster(str(root / "data"), 3, security=security) as cluster:
        cluster.wait_ready()
        yield cluster, security


def _config(security: DevSecurity, **kw: object) -> ClientConfig:
    settings: dict[str, object] = {
        "protocol": "SASL_SSL",
        "username": security.username,
        "password": security.password,
        "ssl_cafile": security.pki.ca,
        **kw,
    }
    return ClientConfig(security=Security(**settings), retry=FEW_RETRIES)  # type: ignore[arg-type]


def test_produce_and_consume_over_tls_and_scram_on_every_broker(
    secure: tuple[SecureCluster, DevSecurity],
) -> None:
    cluster, security = secure
    with Client(cluster.bootstrap, config=_config(security)) as client:
        client.create_topic("secure-sync", 3, 3)
        big = b"x" * 5000  # batches past one TLS record (16 KiB): reads span several
        with Producer(client, ProducerConfig(linger_ms=2, batch_size=64 * 1024)) as producer:
            futures = [producer.send("secure-sync", big + b"%d" % i) for i in range(300)]
            producer.flush()
        offsets = {(f.get().partition, f.get().offset) for f in futures}
        assert len(offsets) == 300
        with Consumer(client) as consumer:
            consumer.assign_topic("secure-sync")
            values = sorted(r.value for r in consumer.records(follow=False) if r.value)
        assert values == sorted(big + b"%d" % i for i in range(300))
        leaders = {p.leader for p in client.describe_topic("secure-sync").partitions}
        assert len(leaders) > 1  # the producer wrote to several brokers, each authenticated
        for address, connection in client._connections.items():
            assert connection.authenticated_as == "admin", address


def test_the_trio_client_over_tls_and_scram(secure: tuple[SecureCluster, DevSecurity]) -> None:
    cluster, security = secure

    async def main() -> None:
        async with AsyncClient(cluster.bootstrap, config=_config(security)) as client:
            await client.create_topic("secure-trio", 2, 3)
            async with open_producer(client) as producer:
                futures = [await producer.send("secure-trio", b"t%d" % i) for i in range(50)]
            assert len({(await f.get()).offset for f in futures}) >= 25
            consumer = AsyncConsumer(client)
            await consumer.assign_topic("secure-trio")
            got = [r.value async for r in consumer.records(follow=False)]
            assert sorted(got) == sorted(b"t%d" % i for i in range(50))  # type: ignore[type-var]

    trio.run(main)


def test_acls_through_the_client(secure: tuple[SecureCluster, DevSecurity]) -> None:
    cluster, security = secure
    carol_writes = AclRow(
        "User:carol",
        AclPermission.ALLOW,
        AclOperation.WRITE,
        AclResource.TOPIC,
        AclPattern.PREFIXED,
        "carol-",
    )
    carol = _config(security, username="carol", password="carol-pw")
    with Client(cluster.bootstrap, config=_config(security)) as admin:
        admin.create_topic("carol-t", 1, 3)
        admin.add_acl(carol_writes)
        admin.add_acl(carol_writes)  # idempotent
        assert admin.list_acls("User:carol") == [carol_writes]
        with Client(cluster.bootstrap, config=carol) as client:
            assert client.publish("carol-t", b"hello")[0] == 0
            with pytest.raises(KafkaesqueError) as caught:
                client.list_acls()
            assert caught.value.code is ErrorCode.NOT_AUTHORIZED
            with pytest.raises(KafkaesqueError) as caught:
                client.delete_topic("carol-t")
            assert caught.value.code is ErrorCode.NOT_AUTHORIZED
        assert admin.remove_acl(carol_writes) == 1
        assert admin.remove_acl(carol_writes) == 0
        assert carol_writes not in admin.list_acls()

    async def trio_side() -> None:
        async with AsyncClient(cluster.bootstrap, config=_config(security)) as client:
            await client.add_acl(carol_writes)
            assert carol_writes in await client.list_acls()
            assert await client.remove_acl(carol_writes) == 1

    trio.run(trio_side)


def test_a_wrong_password_is_auth_failed_at_once(
    secure: tuple[SecureCluster, DevSecurity],
) -> None:
    cluster, security = secure
    config = _config(security, password="wrong")
    with Client(cluster.bootstrap, config=config) as client, pytest.raises(KafkaesqueError) as e:
        client.ping()
    assert e.value.code is ErrorCode.AUTH_FAILED and not e.value.retriable

    async def main() -> None:
        async with AsyncClient(cluster.bootstrap, config=config) as client:
            with pytest.raises(KafkaesqueError) as caught:
                await client.ping()
            assert caught.value.code is ErrorCode.AUTH_FAILED

    trio.run(main)


def test_an_untrusted_ca_is_refused(
    secure: tuple[SecureCluster, DevSecurity], tmp_path: Path
) -> None:
    cluster, security = secure
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    config = _config(security, ssl_cafile=str(other))
    with Client(cluster.bootstrap, config=config) as client, pytest.raises(KafkaesqueError) as e:
        client.ping()
    assert e.value.code is ErrorCode.AUTH_FAILED
    assert "certificate verify failed" in e.value.message


def test_plain_over_tls_and_plaintext_refused(
    secure: tuple[SecureCluster, DevSecurity],
) -> None:
    cluster, security = secure
    plain = _config(security, sasl_mechanism="PLAIN")
    with Client(cluster.bootstrap, config=plain) as client:
        assert client.ping() == "PONG"
    # A plaintext client on the TLS port gets no answer it can read: a bounded failure.
    no_tls = ClientConfig(
        security=Security("SASL_PLAINTEXT", username="admin", password=security.password),
        retry=FEW_RETRIES,
        connect_timeout_ms=2000,
        request_timeout_ms=2000,
    )
    with Client(cluster.bootstrap, config=no_tls) as client, pytest.raises(KafkaesqueError):
        client.ping()
