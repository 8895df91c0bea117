"""PySpark Python Data Source ``kafkaesque``: read topics by offset, batch and streaming."""
