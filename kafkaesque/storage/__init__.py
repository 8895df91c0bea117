"""The partition log on disk: record batches in segment files with a sparse offset index.

See docs/storage-format.md for the byte layout and the durability promises.
"""

from ._batch import (
    HEADER_SIZE,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    BatchHeader,
    BatchType,
    PackedRecord,
    RawRecord,
    Record,
    build_batch,
    data_raw_records,
    data_records,
    decode_header,
    decode_records,
    end_offset,
    iter_batches,
    pack_batch,
    raw_records,
    stamp,
    stamped_prefix,
)
from ._cleaner import CompactionResult
from ._errors import CorruptLogError, InvalidBatchError, OffsetOutOfRangeError, StorageError
from ._partition_log import PartitionLog, wall_clock_ms
from ._segment import RecoveryReport, segment_data_end
from ._statefile import fsync_directory, makedirs_durable, read_state_file, write_state_file
from ._types import AppendResult, CheckedBatch, FlushTicket, FsyncPolicy, LogConfig, ReadResult

__all__ = [
    "PackedRecord",
    "RawRecord",
    "HEADER_SIZE",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "AppendResult",
    "BatchHeader",
    "BatchType",
    "CheckedBatch",
    "CompactionResult",
    "CorruptLogError",
    "FlushTicket",
    "FsyncPolicy",
    "InvalidBatchError",
    "LogConfig",
    "OffsetOutOfRangeError",
    "PartitionLog",
    "ReadResult",
    "Record",
    "RecoveryReport",
    "StorageError",
    "build_batch",
    "data_raw_records",
    "data_records",
    "decode_header",
    "decode_records",
    "pack_batch",
    "raw_records",
    "end_offset",
    "fsync_directory",
    "makedirs_durable",
    "iter_batches",
    "read_state_file",
    "segment_data_end",
    "stamp",
    "stamped_prefix",
    "wall_clock_ms",
    "write_state_file",
]
