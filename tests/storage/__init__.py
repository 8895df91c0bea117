"""Tests of kafkaesque.storage."""
