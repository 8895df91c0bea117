"""How the broker names a partition's replicated log: the id its Raft replicas, its peers' messages
and the leader table use (a consumer group is never named by one)."""


def log_id_of(topic: str, partition: int) -> str:
    """The log id of a partition: ``topic/partition`` (a topic name has no ``/``)."""
    return f"{topic}/{partition}"
