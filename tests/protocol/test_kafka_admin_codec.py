"""The schemas of the SASL, ACL, config and partition APIs (``_admin_apis``), each request and
response at every version served, round-tripped through our codec and checked against
kafka-python's protocol classes as an oracle: they must read our bytes as the same message, and
write them back byte for byte."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkaesque.protocol.kafka import (
    ADMIN_APIS,
    CREATE_ACLS,
    CREATE_PARTITIONS,
    DELETE_ACLS,
    DESCRIBE_ACLS,
    DESCRIBE_CONFIGS,
    INCREMENTAL_ALTER_CONFIGS,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    Api,
    Message,
    Reader,
    Writer,
)
from kafkaesque.protocol.kafka._schema import check_fully_read, decode, encode
from tests.protocol.test_kafka_codec import struct_of

kafka_admin = pytest.importorskip("kafka.protocol.admin")
kafka_sasl = pytest.importorskip("kafka.protocol.sasl")

_FILTER = {
    "resource_type_filter": 2,
    "resource_name_filter": "orders",
    "pattern_type_filter": 3,
    "principal_filter": None,
    "host_filter": "*",
    "operation": 1,
    "permission_type": 3,
}
_ACL = {"principal": "User:alice", "host": "*", "operation": 3, "permission_type": 3}
SAMPLES: dict[str, tuple[Message, Message]] = {
    "SaslHandshake": (
        {"mechanism": "SCRAM-SHA-256"},
        {"error_code": 0, "mechanisms": ["SCRAM-SHA-256", "PLAIN"]},
    ),
    "SaslAuthenticate": (
        {"auth_bytes": b"n,,n=alice,r=abc"},
        {"error_code": 58, "error_message": "no", "auth_bytes": b"", "session_lifetime_ms": 7},
    ),
    "DescribeAcls": (
        _FILTER,
        {
            "throttle_time_ms": 0,
            "error_code": 0,
            "error_message": None,
            "resources": [
                {
                    "resource_type": 2,
                    "resource_name": "orders",
                    "pattern_type": 4,
                    "acls": [_ACL, {**_ACL, "operation": 4, "permission_type": 2}],
                }
            ],
        },
    ),
    "CreateAcls": (
        {
            "creations": [
                {"resource_type": 3, "resource_name": "g", "resource_pattern_type": 3, **_ACL}
            ]
        },
        {"throttle_time_ms": 1, "results": [{"error_code": 0, "error_message": None}]},
    ),
    "DeleteAcls": (
        {"filters": [_FILTER, {**_FILTER, "resource_name_filter": None}]},
        {
            "throttle_time_ms": 0,
            "filter_results": [
                {
                    "error_code": 0,
                    "error_message": None,
                    "matching_acls": [
                        {
                            "error_code": 0,
                            "error_message": None,
                            "resource_type": 2,
                            "resource_name": "orders",
                            "pattern_type": 3,
                            **_ACL,
                        }
                    ],
                }
            ],
        },
    ),
    "DescribeConfigs": (
        {
            "resources": [
                {"resource_type": 2, "resource_name": "t", "configuration_keys": ["retention.ms"]},
                {"resource_type": 4, "resource_name": "0", "configuration_keys": None},
            ],
            "include_synonyms": True,
            "include_documentation": False,
        },
        {
            "throttle_time_ms": 0,
            "results": [
                {
                    "error_code": 0,
                    "error_message": None,
                    "resource_type": 2,
                    "resource_name": "t",
                    "configs": [
                        {
                            "name": "retention.ms",
                            "value": "3600000",
                            "read_only": False,
                            "config_source": 1,
                            "is_sensitive": False,
                            "synonyms": [{"name": "log.retention.ms", "value": None, "source": 5}],
                            "config_type": 5,
                            "documentation": None,
                        }
                    ],
                }
            ],
        },
    ),
    "IncrementalAlterConfigs": (
        {
            "resources": [
                {
                    "resource_type": 2,
                    "resource_name": "t",
                    "configs": [
                        {"name": "retention.ms", "config_operation": 0, "value": "1000"},
                        {"name": "cleanup.policy", "config_operation": 1, "value": None},
                    ],
                }
            ],
            "validate_only": False,
        },
        {
            "throttle_time_ms": 0,
            "responses": [
                {"error_code": 40, "error_message": "x", "resource_type": 2, "resource_name": "t"}
            ],
        },
    ),
    "CreatePartitions": (
        {
            "topics": [
                {"name": "t", "count": 6, "assignments": None},
                {"name": "u", "count": 2, "assignments": [{"broker_ids": [1, 2]}]},
            ],
            "timeout_ms": 30000,
            "validate_only": True,
        },
        {
            "throttle_time_ms": 0,
            "results": [{"name": "t", "error_code": 37, "error_message": "not an increase"}],
        },
    ),
}

ORACLES: dict[str, tuple[Any, Any]] = {
    "SaslHandshake": (kafka_sasl.SaslHandshakeRequest, kafka_sasl.SaslHandshakeResponse),
    "SaslAuthenticate": (kafka_sasl.SaslAuthenticateRequest, kafka_sasl.SaslAuthenticateResponse),
    "DescribeAcls": (kafka_admin.DescribeAclsRequest, kafka_admin.DescribeAclsResponse),
    "CreateAcls": (kafka_admin.CreateAclsRequest, kafka_admin.CreateAclsResponse),
    "DeleteAcls": (kafka_admin.DeleteAclsRequest, kafka_admin.DeleteAclsResponse),
    "DescribeConfigs": (kafka_admin.DescribeConfigsRequest, kafka_admin.DescribeConfigsResponse),
    "IncrementalAlterConfigs": (
        kafka_admin.IncrementalAlterConfigsRequest,
        kafka_admin.IncrementalAlterConfigsResponse,
    ),
    "CreatePartitions": (
        kafka_admin.CreatePartitionsRequest,
        kafka_admin.CreatePartitionsResponse,
    ),
}

CASES = [
    (api, version, side)
    for api in ADMIN_APIS
    for version in range(api.min_version, api.max_version + 1)
    for side in ("request", "response")
]


def _ours(api: Api, version: int, side: str, message: Message) -> tuple[bytes, Message]:
    schema = api.request if side == "request" else api.response
    w = Writer()
    encode(schema, version, message, w)
    data = bytes(w.buf)
    reader = Reader(data)
    decoded = decode(schema, version, reader)
    check_fully_read(reader, api.name)
    return data, decoded


def _present(decoded: Message) -> Message:
    """``decoded`` without the tagged-field sections (compared by bytes instead)."""
    out: Message = {}
    for key, value in decoded.items():
        if key == "_tagged":
            continue
        if isinstance(value, list):
            value = [_present(v) if isinstance(v, dict) else v for v in value]
        out[key] = value
    return out


def _subset(message: Message, decoded: Message) -> None:
    """Every field of ``decoded`` (one version's) holds what ``message`` gave for it."""
    for key, value in decoded.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            for given, got in zip(message[key], value, strict=True):
                _subset(given, got)
        else:
            assert value == message[key], key


@pytest.mark.parametrize(("api", "version", "side"), CASES, ids=lambda c: getattr(c, "name", c))
def test_round_trip_and_kafka_python_reads_and_writes_the_same_bytes(
    api: Api, version: int, side: str
) -> None:
    request, response = SAMPLES[api.name]
    message = request if side == "request" else response
    data, decoded = _ours(api, version, side, message)
    _subset(message, _present(decoded))
    oracle = ORACLES[api.name][0 if side == "request" else 1]
    theirs = oracle.decode(data, version=version)
    assert bytes(theirs.encode()) == data  # (decoded at ``version``, written at it)
    # kafka-python's reading of each field is ours.
    _subset(
        _present(decoded), {k: v for k, v in theirs.to_dict(json=False).items() if k in decoded}
    )


def test_every_admin_api_is_listed_with_its_versions() -> None:
    from kafkaesque.protocol.kafka import supported_versions

    listed = {v["api_key"]: (v["min_version"], v["max_version"]) for v in supported_versions()}
    assert {a.key: (a.min_version, a.max_version) for a in ADMIN_APIS} == {
        SASL_HANDSHAKE.key: (0, 1),
        SASL_AUTHENTICATE.key: (0, 1),
        DESCRIBE_ACLS.key: (0, 1),
        CREATE_ACLS.key: (0, 1),
        DELETE_ACLS.key: (0, 1),
        DESCRIBE_CONFIGS.key: (1, 3),
        INCREMENTAL_ALTER_CONFIGS.key: (0, 1),
        CREATE_PARTITIONS.key: (0, 1),
    }
    assert all(listed[a.key] == (a.min_version, a.max_version) for a in ADMIN_APIS)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(ADMIN_APIS), st.booleans(), st.data())
def test_kafka_python_writes_back_the_same_bytes_for_any_admin_message(
    api: Api, request: bool, data: Any
) -> None:
    """Random messages of each schema (strings, nulls, arrays of every size the codec allows):
    kafka-python reads our bytes and writes back the same ones, so no field is in the wrong
    place or version."""
    version = data.draw(st.integers(api.min_version, api.max_version))
    side = "request" if request else "response"
    schema = api.request if request else api.response
    body = data.draw(struct_of(schema.fields, version))
    ours, _ = _ours(api, version, side, body)
    theirs = ORACLES[api.name][0 if request else 1].decode(ours, version=version)
    assert bytes(theirs.encode()) == ours
