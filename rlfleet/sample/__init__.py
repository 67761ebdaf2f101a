"""Sample, the unit of data, and everything that moves or checks it.

record.py holds the Sample dataclass and its lossless conversion to and from the rlfleet.v1.Sample message;
limits.py the bounds every Sample entering the buffer must respect; batch_check.py checks many messages in one pass;
put_wire.py frames serialized Samples as a Buffer.Put request; packed_arrays.py packs token ids and floats.
The public names are importable from here: `from rlfleet.sample import Sample, Status`.
"""

from __future__ import annotations

from rlfleet.sample.record import (
    FREE_ROUTE,
    RoutedExperts,
    Sample,
    SampleError,
    SequenceTooLong,
    Status,
    check_fields,
    sample_key,
    validate_message,
)

__all__ = ["FREE_ROUTE", "RoutedExperts", "Sample", "SampleError", "SequenceTooLong", "Status", "check_fields",
           "sample_key", "validate_message"]
