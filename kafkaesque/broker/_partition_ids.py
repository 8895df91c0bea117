"""How the broker names a partition's Raft group (the id its peers and the metadata use)."""


def log_id_of(topic: str, partition: int) -> str:
    """The Raft group id of a partition: ``topic/partition`` (a topic name has no ``/``)."""
    return f"{topic}/{partition}"
