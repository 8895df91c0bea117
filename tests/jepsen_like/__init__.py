"""Tests of kafkaesque.jepsen_like: the history format and its checker."""
