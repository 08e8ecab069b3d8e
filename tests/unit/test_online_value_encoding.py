"""The online writers' column-wise encoding of feature values is byte for byte Feast's protobuf `Value`,
and the reader's direct decoding gives back what Feast's own conversion gives."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest
from feast.protos.feast.types.Value_pb2 import Value
from feast.type_map import feast_value_type_to_python_type

from features.online_store import _decode_double, _decode_int64, encode_double, encode_int64

DOUBLES = [
    1.5,
    0.0,
    -0.0,
    -2.75,
    1e-300,
    5e-324,
    1.7976931348623157e308,
    math.inf,
    -math.inf,
    math.nan,
    None,
    123.0,
    1e16,
]
INTEGERS = [0, 1, 127, 128, 300, 16383, 16384, 2**31, 2**53 + 1, 2**63 - 1, -1, -128, -(2**63), None]


def feast_bytes(values: list, field: str) -> list[bytes]:
    """What Feast stores: an empty Value for None and NaN (pandas nulls), else the value's field set."""
    return [
        b""
        if v is None or (isinstance(v, float) and math.isnan(v))
        else Value(**{field: v}).SerializeToString()
        for v in values
    ]


def test_doubles_encode_as_feast_values():
    encoded, valid, _ = encode_double(pa.array(DOUBLES, pa.float64()))
    assert encoded == feast_bytes(DOUBLES, "double_val")
    assert valid.tolist() == [v is not None and not (isinstance(v, float) and math.isnan(v)) for v in DOUBLES]


def test_int64_encodes_as_feast_values_including_negative_and_extreme_ones():
    encoded, valid, _ = encode_int64(pa.array(INTEGERS, pa.int64()))
    assert encoded == feast_bytes(INTEGERS, "int64_val")
    assert valid.tolist() == [v is not None for v in INTEGERS]


def test_a_chunked_column_of_another_width_is_cast_first():
    column = pa.chunked_array([pa.array([1, 2], pa.int32()), pa.array([None, 400], pa.int32())])
    encoded, _, _ = encode_int64(column.combine_chunks())
    assert encoded == feast_bytes([1, 2, None, 400], "int64_val")


@pytest.mark.parametrize(
    ("decode", "values", "field"),
    [(_decode_double, DOUBLES, "double_val"), (_decode_int64, INTEGERS, "int64_val")],
)
def test_direct_decoding_matches_feasts_conversion(decode, values, field):
    for raw in [*feast_bytes(values, field), None, Value(string_val="x").SerializeToString()]:
        expected = None if raw is None else feast_value_type_to_python_type(Value.FromString(raw))
        got = decode(raw)
        if isinstance(expected, float) and math.isnan(expected):
            assert math.isnan(got)
        else:
            assert got == expected and type(got) is type(expected), (raw, got, expected)
