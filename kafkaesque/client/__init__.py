"""The client library (sync and trio): batching producer, consumer, admin."""
