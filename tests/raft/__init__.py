"""Tests of the Raft core: paper-sentence unit tests, wire format, and the simulator."""
