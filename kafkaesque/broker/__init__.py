"""The broker: sessions, routing, metadata and consumer groups over the partition Raft groups."""
