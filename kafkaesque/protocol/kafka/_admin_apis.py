"""The Kafka security and admin APIs served: SASL, ACLs, topic configs and partition growth.

Written, as ``_apis``, from Kafka's message definitions (clients/src/main/resources/common/
message/*.json of Apache Kafka 4.x) for the versions listed; a field that exists only in other
versions is left out. The versions are those of about Kafka 2.3, with the low minimums clients
of that age send: SaslHandshake 0-1 (v0: the SASL tokens then travel as bare frames, without a
Kafka header), SaslAuthenticate 0-1, DescribeAcls/CreateAcls/DeleteAcls 0-1 (v1 adds the
pattern type), DescribeConfigs 1-3, IncrementalAlterConfigs 0-1 (v1 is flexible) and
CreatePartitions 0-1.

Kafka's codes that these carry (the wire values, org.apache.kafka.common.acl and
org.apache.kafka.common.resource): ``ResourceType``, ``AclOperationCode``, ``PermissionType``,
``PatternType``, ``ConfigResourceType`` and ``ConfigOperation``.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

from ._schema import Api, Field, Schema, array

SASL_HANDSHAKE = Api(
    17,
    "SaslHandshake",
    0,
    1,
    Schema((Field("mechanism", "string"),)),
    Schema((Field("error_code", "int16"), array("mechanisms", "string"))),
)

SASL_AUTHENTICATE = Api(
    36,
    "SaslAuthenticate",
    0,
    1,
    Schema((Field("auth_bytes", "bytes"),), flexible_since=2),
    Schema(
        (
            Field("error_code", "int16"),
            Field("error_message", "string", nullable_since=0),
            Field("auth_bytes", "bytes"),
            Field("session_lifetime_ms", "int64", since=1),
        ),
        flexible_since=2,
    ),
)

# An ACL filter's fields, as DescribeAcls and each filter of DeleteAcls have them.
_ACL_FILTER: Final = (
    Field("resource_type_filter", "int8"),
    Field("resource_name_filter", "string", nullable_since=0),
    Field("pattern_type_filter", "int8", since=1, default=3),
    Field("principal_filter", "string", nullable_since=0),
    Field("host_filter", "string", nullable_since=0),
    Field("operation", "int8"),
    Field("permission_type", "int8"),
)

DESCRIBE_ACLS = Api(
    29,
    "DescribeAcls",
    0,
    1,
    Schema(_ACL_FILTER, flexible_since=2),
    Schema(
        (
            Field("throttle_time_ms", "int32"),
            Field("error_code", "int16"),
            Field("error_message", "string", nullable_since=0),
            array(
                "resources",
                (
                    Field("resource_type", "int8"),
                    Field("resource_name", "string"),
                    Field("pattern_type", "int8", since=1, default=3),
                    array(
                        "acls",
                        (
                            Field("principal", "string"),
                            Field("host", "string"),
                            Field("operation", "int8"),
                            Field("permission_type", "int8"),
                        ),
                    ),
                ),
            ),
        ),
        flexible_since=2,
    ),
)

CREATE_ACLS = Api(
    30,
    "CreateAcls",
    0,
    1,
    Schema(
        (
            array(
                "creations",
                (
                    Field("resource_type", "int8"),
                    Field("resource_name", "string"),
                    Field("resource_pattern_type", "int8", since=1, default=3),
                    Field("principal", "string"),
                    Field("host", "string"),
                    Field("operation", "int8"),
                    Field("permission_type", "int8"),
                ),
            ),
        ),
        flexible_since=2,
    ),
    Schema(
        (
            Field("throttle_time_ms", "int32"),
            array(
                "results",
                (Field("error_code", "int16"), Field("error_message", "string", nullable_since=0)),
            ),
        ),
        flexible_since=2,
    ),
)

DELETE_ACLS = Api(
    31,
    "DeleteAcls",
    0,
    1,
    Schema((array("filters", _ACL_FILTER),), flexible_since=2),
    Schema(
        (
            Field("throttle_time_ms", "int32"),
            array(
                "filter_results",
                (
                    Field("error_code", "int16"),
                    Field("error_message", "string", nullable_since=0),
                    array(
                        "matching_acls",
                        (
                            Field("error_code", "int16"),
                            Field("error_message", "string", nullable_since=0),
                            Field("resource_type", "int8"),
                            Field("resource_name", "string"),
                            Field("pattern_type", "int8", since=1, default=3),
                            Field("principal", "string"),
                            Field("host", "string"),
                            Field("operation", "int8"),
                            Field("permission_type", "int8"),
                        ),
                    ),
                ),
            ),
        ),
        flexible_since=2,
    ),
)

DESCRIBE_CONFIGS = Api(
    32,
    "DescribeConfigs",
    1,
    3,
    Schema(
        (
            array(
                "resources",
                (
                    Field("resource_type", "int8"),
                    Field("resource_name", "string"),
                    array("configuration_keys", "string", nullable_since=0),
                ),
            ),
            Field("include_synonyms", "bool", since=1),
            Field("include_documentation", "bool", since=3),
        ),
        flexible_since=4,
    ),
    Schema(
        (
            Field("throttle_time_ms", "int32"),
            array(
                "results",
                (
                    Field("error_code", "int16"),
                    Field("error_message", "string", nullable_since=0),
                    Field("resource_type", "int8"),
                    Field("resource_name", "string"),
                    array(
                        "configs",
                        (
                            Field("name", "string"),
                            Field("value", "string", nullable_since=0),
                            Field("read_only", "bool"),
                            Field("config_source", "int8", since=1, default=-1),
                            Field("is_sensitive", "bool"),
                            array(
                                "synonyms",
                                (
                                    Field("name", "string"),
                                    Field("value", "string", nullable_since=0),
                                    Field("source", "int8"),
                                ),
                                since=1,
                            ),
                            Field("config_type", "int8", since=3),
                            Field("documentation", "string", since=3, nullable_since=0),
                        ),
                    ),
                ),
            ),
        ),
        flexible_since=4,
    ),
)

INCREMENTAL_ALTER_CONFIGS = Api(
    44,
    "IncrementalAlterConfigs",
    0,
    1,
    Schema(
        (
            array(
                "resources",
                (
                    Field("resource_type", "int8"),
                    Field("resource_name", "string"),
                    array(
                        "configs",
                        (
                            Field("name", "string"),
                            Field("config_operation", "int8"),
                            Field("value", "string", nullable_since=0),
                        ),
                    ),
                ),
            ),
            Field("validate_only", "bool"),
        ),
        flexible_since=1,
    ),
    Schema(
        (
            Field("throttle_time_ms", "int32"),
            array(
                "responses",
                (
                    Field("error_code", "int16"),
                    Field("error_message", "string", nullable_since=0),
                    Field("resource_type", "int8"),
                    Field("resource_name", "string"),
                ),
            ),
        ),
        flexible_since=1,
    ),
)

CREATE_PARTITIONS = Api(
    37,
    "CreatePartitions",
    0,
    1,
    Schema(
        (
            array(
                "topics",
                (
                    Field("name", "string"),
                    Field("count", "int32"),
                    array(
                        "assignments",
                        (array("broker_ids", "int32"),),
                        nullable_since=0,
                    ),
                ),
            ),
            Field("timeout_ms", "int32"),
            Field("validate_only", "bool"),
        ),
        flexible_since=2,
    ),
    Schema(
        (
            Field("throttle_time_ms", "int32"),
            array(
                "results",
                (
                    Field("name", "string"),
                    Field("error_code", "int16"),
                    Field("error_message", "string", nullable_since=0),
                ),
            ),
        ),
        flexible_since=2,
    ),
)

ADMIN_APIS: Final = (
    SASL_HANDSHAKE,
    SASL_AUTHENTICATE,
    DESCRIBE_ACLS,
    CREATE_ACLS,
    DELETE_ACLS,
    DESCRIBE_CONFIGS,
    INCREMENTAL_ALTER_CONFIGS,
    CREATE_PARTITIONS,
)
"""The APIs of this module, registered in ``APIS``."""


class ResourceType(IntEnum):
    """Kafka's ACL resource types (org.apache.kafka.common.resource.ResourceType)."""

    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class AclOperationCode(IntEnum):
    """Kafka's ACL operations (org.apache.kafka.common.acl.AclOperation)."""

    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class PermissionType(IntEnum):
    """Kafka's ACL permission types (org.apache.kafka.common.acl.AclPermissionType)."""

    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


class PatternType(IntEnum):
    """Kafka's resource pattern types (org.apache.kafka.common.resource.PatternType)."""

    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class ConfigResourceType(IntEnum):
    """DescribeConfigs' and IncrementalAlterConfigs' resource types (ConfigResource.Type)."""

    UNKNOWN = 0
    TOPIC = 2
    BROKER = 4
    BROKER_LOGGER = 8


class ConfigOperation(IntEnum):
    """IncrementalAlterConfigs' operations (AlterConfigOp.OpType)."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


class ConfigSource(IntEnum):
    """Where a described config's value comes from (DescribeConfigsResponse.ConfigSource)."""

    UNKNOWN = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


class ConfigType(IntEnum):
    """A described config's type (DescribeConfigsResponse.ConfigType, v3+)."""

    UNKNOWN = 0
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9
