"""The ``kafkaesque`` command."""
