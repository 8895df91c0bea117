"""Raft, one group per partition: a pure core, a trio driver and a msgpack transport."""
