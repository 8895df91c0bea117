"""The schemas of Kafka's classic consumer-group APIs, for the versions listed (see ``_apis``'s
docstring for where they come from): FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, OffsetCommit, OffsetFetch, ListGroups, DescribeGroups, DeleteGroups.

The ranges are the Kafka 2.3 level that shared/research/kafka-protocol.md lists: their minimums
are what old librdkafka looks for (FindCoordinator, JoinGroup, SyncGroup, Heartbeat and
LeaveGroup from v0, OffsetFetch from v1), their maxima stop below the first flexible version;
except ListGroups, up to v5 (its filters: see below).
"""

from __future__ import annotations

from typing import Final

from ._schema import INT32_MIN, Api, Field, Schema, array

FIND_COORDINATOR = Api(
    10,
    "FindCoordinator",
    0,
    2,
    Schema(
        (Field("key", "string"), Field("key_type", "int8", since=1)),
        flexible_since=3,
    ),
    Schema(
        (
            Field("throttle_time_ms", "int32", since=1),
            Field("error_code", "int16"),
            Field("error_message", "string", since=1, nullable_since=1),
            Field("node_id", "int32", default=-1),
            Field("host", "string", default=""),
            Field("port", "int32", default=-1),
        ),
        flexible_since=3,
    ),
)

JOIN_GROUP = Api(
    11,
    "JoinGroup",
    0,
    5,
    Schema(
        (
            Field("group_id", "string"),
            Field("session_timeout_ms", "int32"),
            Field("rebalance_timeout_ms", "int32", since=1, default=-1),
            Field("member_id", "string"),
            Field("group_instance_id", "string", since=5, nullable_since=5),
            Field("protocol_type", "string"),
            array("protocols", (Field("name", "string"), Field("metadata", "bytes"))),
        ),
        flexible_since=6,
    ),
    Schema(
        (
            Field("throttle_time_ms", "int32", since=2),
            Field("error_code", "int16"),
            Field("generation_id", "int32", default=-1),
            Field("protocol_name", "string", default=""),
            Field("leader", "string", default=""),
            Field("member_id", "string", default=""),
            array(
                "members",
                (
                    Field("member_id", "string"),
                    Field("group_instance_id", "string", since=5, nullable_since=5),
                    Field("metadata", "bytes"),
                ),
            ),
        ),
        flexible_since=6,
    ),
)

SYNC_GROUP = Api(
    14,
    "SyncGroup",
    0,
    3,
    Schema(
        (
            Field("group_id", "string"),
            Field("generation_id", "int32"),
            Field("member_id", "string"),
            Field("group_instance_id", "string", since=3, nullable_since=3),
            array("assignments", (Field("member_id", "string"), Field("assignment", "bytes"))),
        ),
        flexible_since=4,
    ),
    Schema(
        (
            Field("throttle_time_ms", "int32", since=1),
            Field("error_code", "int16"),
            Field("assignment", "bytes", default=b""),
        ),
        flexible_since=4,
    ),
)

HEARTBEAT = Api(
    12,
    "Heartbeat",
    0,
    3,
    Schema(
        (
            Field("group_id", "string"),
            Field("generation_id", "int32"),
            Field("member_id", "string"),
            Field("group_instance_id", "string", since=3, nullable_since=3),
        ),
        flexible_since=4,
    ),
    Schema(
        (Field("throttle_time_ms", "int32", since=1), Field("error_code", "int16")),
        flexible_since=4,
    ),
)

LEAVE_GROUP = Api(
    13,
    "LeaveGroup",
    0,
    3,
    Schema(
        (
            Field("group_id", "string"),
            Field("member_id", "string", until=2),
            array(
                "members",
                (
                    Field("member_id", "string"),
                    Field("group_instance_id", "string", nullable_since=3),
                ),
                since=3,
            ),
        ),
        flexible_since=4,
    ),
    Schema(
        (
            Field("throttle_time_ms", "int32", since=1),
            Field("error_code", "int16"),
            array(
                "members",
                (
                    Field("member_id", "string"),
                    Field("group_instance_id", "string", nullable_since=3),
                    Field("error_code", "int16"),
                ),
                since=3,
            ),
        ),
        flexible_since=4,
    ),
)

OFFSET_COMMIT = Api(
    8,
    "OffsetCommit",
    2,
    7,
    Schema(
        (
            Field("group_id", "string"),
            Field("generation_id", "int32", default=-1),
            Field("member_id", "string"),
            Field("group_instance_id", "string", since=7, nullable_since=7),
            Field("retention_time_ms", "int64", since=2, until=4, default=-1),
            array(
                "topics",
                (
                    Field("name", "string"),
                    array(
                        "partitions",
                        (
                            Field("partition_index", "int32"),
                            Field("committed_offset", "int64"),
                            Field("committed_leader_epoch", "int32", since=6, default=-1),
                            Field("committed_metadata", "string", nullable_since=0),
                        ),
                    ),
                ),
            ),
        ),
        flexible_since=8,
    ),
    Schema(
        (
            Field("throttle_time_ms", "int32", since=3),
            array(
                "topics",
                (
                    Field("name", "string"),
                    array(
                        "partitions",
                        (Field("partition_index", "int32"), Field("error_code", "int16")),
                    ),
                ),
            ),
        ),
        flexible_since=8,
    ),
)

OFFSET_FETCH = Api(
    9,
    "OffsetFetch",
    1,
    5,
    Schema(
        (
            Field("group_id", "string"),
            array(
                "topics",
                (Field("name", "string"), array("partition_indexes", "int32")),
                nullable_since=2,
            ),
        ),
        flexible_since=6,
    ),
    Schema(
        (
            Field("throttle_time_ms", "int32", since=3),
            array(
                "topics",
                (
                    Field("name", "string"),
                    array(
                        "partitions",
                        (
                            Field("partition_index", "int32"),
                            Field("committed_offset", "int64", default=-1),
                            Field("committed_leader_epoch", "int32", since=5, default=-1),
                            Field("metadata", "string", nullable_since=0),
                            Field("error_code", "int16"),
                        ),
                    ),
                ),
            ),
            Field("error_code", "int16", since=2),
        ),
        flexible_since=6,
    ),
)

# Up to v5 (flexible from v3): the state filter (v4, KIP-518) and the group type (v5, KIP-848's
# "classic" or "consumer") that admin clients filter by, librdkafka's among them.
LIST_GROUPS = Api(
    16,
    "ListGroups",
    0,
    5,
    Schema(
        (array("states_filter", "string", since=4), array("types_filter", "string", since=5)),
        flexible_since=3,
    ),
    Schema(
        (
            Field("throttle_time_ms", "int32", since=1),
            Field("error_code", "int16"),
            array(
                "groups",
                (
                    Field("group_id", "string"),
                    Field("protocol_type", "string"),
                    Field("group_state", "string", since=4, default=""),
                    Field("group_type", "string", since=5, default=""),
                ),
            ),
        ),
        flexible_since=3,
    ),
)

DESCRIBE_GROUPS = Api(
    15,
    "DescribeGroups",
    0,
    4,
    Schema(
        (
            array("groups", "string"),
            Field("include_authorized_operations", "bool", since=3),
        ),
        flexible_since=5,
    ),
    Schema(
        (
            Field("throttle_time_ms", "int32", since=1),
            array(
                "groups",
                (
                    Field("error_code", "int16"),
                    Field("group_id", "string"),
                    Field("group_state", "string", default=""),
                    Field("protocol_type", "string", default=""),
                    Field("protocol_data", "string", default=""),
                    array(
                        "members",
                        (
                            Field("member_id", "string"),
                            Field("group_instance_id", "string", since=4, nullable_since=4),
                            Field("client_id", "string"),
                            Field("client_host", "string"),
                            Field("member_metadata", "bytes"),
                            Field("member_assignment", "bytes"),
                        ),
                    ),
                    Field("authorized_operations", "int32", since=3, default=INT32_MIN),
                ),
            ),
        ),
        flexible_since=5,
    ),
)

DELETE_GROUPS = Api(
    42,
    "DeleteGroups",
    0,
    1,
    Schema((array("groups_names", "string"),), flexible_since=2),
    Schema(
        (
            Field("throttle_time_ms", "int32"),
            array("results", (Field("group_id", "string"), Field("error_code", "int16"))),
        ),
        flexible_since=2,
    ),
)

GROUP_APIS: Final = (
    FIND_COORDINATOR,
    JOIN_GROUP,
    SYNC_GROUP,
    HEARTBEAT,
    LEAVE_GROUP,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    LIST_GROUPS,
    DESCRIBE_GROUPS,
    DELETE_GROUPS,
)
"""The consumer-group APIs, registered in ``_apis.APIS``."""
