"""Tests of kafkaesque.protocol."""
