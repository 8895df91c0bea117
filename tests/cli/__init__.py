"""Tests of the kafkaesque command."""
