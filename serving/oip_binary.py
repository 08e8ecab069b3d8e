"""The Open Inference Protocol's binary tensor data extension (`binary_tensor_data`), as KServe's and Triton's
HTTP clients speak it.

A request with binary inputs is one body: its JSON header (the length in the `Inference-Header-Content-Length`
header), then each binary input's raw data in the order of `inputs`, each input naming its byte count in
`parameters.binary_data_size`. Numbers are little-endian in their datatype's width; a BYTES element is a
4-byte little-endian length and that many bytes. The answer is binary the same way for each output asked for
with `parameters.binary_data` (or all of them with the request's `parameters.binary_data_output`).

Everything here is a caller's bytes: a size that does not add up, a datatype we do not read, an element
cut short is a ProtocolError naming the input and what to send, never a crash or a guess.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson

HEADER = "inference-header-content-length"
EXTENSION = "binary_tensor_data"
NUMERIC = {
    "BOOL": "<?",
    "INT8": "<i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "UINT8": "<u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "FP32": "<f4",
    "FP64": "<f8",
}


class ProtocolError(ValueError):
    """The request breaks the protocol or its binary extension: 400 with this message."""


def split(raw: bytes, header_length: str | None) -> tuple[Any, bytes]:
    """(the JSON header, parsed; the binary data after it). Without the header, all of `raw` is JSON."""
    if header_length is None:
        json_part, binary = raw, b""
    else:
        if not header_length.isdigit() or int(header_length) > len(raw):
            raise ProtocolError(
                f"{HEADER}: {header_length[:20]!r} is not a byte count within the body ({len(raw)} bytes)"
            )
        json_part, binary = raw[: int(header_length)], raw[int(header_length) :]
    try:
        return orjson.loads(json_part), binary
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"the request's JSON header is not JSON: {exc}") from None


def _bytes_elements(name: str, chunk: bytes) -> list[str]:
    out, at = [], 0
    while at < len(chunk):
        if at + 4 > len(chunk):
            raise ProtocolError(f"input {name!r}: a BYTES element's 4-byte length is cut short")
        (size,) = struct.unpack_from("<I", chunk, at)
        at += 4
        if at + size > len(chunk):
            raise ProtocolError(f"input {name!r}: a BYTES element says {size} bytes, fewer are left")
        try:
            out.append(chunk[at : at + size].decode("utf-8"))
        except UnicodeDecodeError:
            raise ProtocolError(f"input {name!r}: a BYTES element is not UTF-8 text") from None
        at += size
    return out


def fill_binary_inputs(body: dict[str, Any], binary: bytes) -> None:
    """Give each input sent as binary its `data` list, in place, from `binary` (in the order of `inputs`).
    Raises ProtocolError when the sizes do not add up or an element cannot be read."""
    at = 0
    for tensor in body.get("inputs") or []:
        if not isinstance(tensor, dict):
            continue  # the JSON check names it
        parameters = tensor.get("parameters") or {}
        size = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
        if size is None:
            continue
        name = tensor.get("name")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ProtocolError(f"input {name!r}: binary_data_size must be a byte count, got {size!r}")
        if "data" in tensor:
            raise ProtocolError(f"input {name!r}: give `data` or binary_data_size, not both")
        if at + size > len(binary):
            raise ProtocolError(
                f"input {name!r}: binary_data_size {size} runs past the body's binary data "
                f"({len(binary)} bytes)"
            )
        chunk = binary[at : at + size]
        at += size
        datatype = tensor.get("datatype")
        if datatype == "BYTES":
            tensor["data"] = _bytes_elements(str(name), chunk)
        elif datatype in NUMERIC:
            width = np.dtype(NUMERIC[datatype]).itemsize
            if size % width:
                raise ProtocolError(f"input {name!r}: {size} bytes are not whole {datatype} values")
            values = np.frombuffer(chunk, dtype=NUMERIC[datatype])
            tensor["data"] = [None if v != v else v for v in values.tolist()]  # NaN: no value
        else:
            raise ProtocolError(
                f"input {name!r}: datatype {datatype!r} cannot be read as binary; use one of "
                f"{', '.join(['BYTES', *NUMERIC])}"
            )
    if at != len(binary):
        raise ProtocolError(
            f"the body has {len(binary) - at} bytes of binary data no input's binary_data_size accounts for"
        )


def wants_binary(body: dict[str, Any], answered: list[str]) -> set[str]:
    """Which of the `answered` outputs go back as binary: each output's own `parameters.binary_data`, else
    the request's `parameters.binary_data_output`."""
    parameters = body.get("parameters")
    every = bool(parameters.get("binary_data_output")) if isinstance(parameters, dict) else False
    own: dict[str, bool] = {}
    asked = body.get("outputs")
    for output in asked if isinstance(asked, list) else []:
        given = output.get("parameters") if isinstance(output, dict) else None
        if isinstance(given, dict) and "binary_data" in given:
            own[str(output.get("name"))] = bool(given["binary_data"])
    return {name for name in answered if own.get(name, every)}


def asked_outputs(body: dict[str, Any], available: tuple[str, ...]) -> list[str]:
    """The outputs to answer, in the order asked (all of them when none is named). Raises ProtocolError for
    one this model does not have."""
    asked = body.get("outputs")
    if not isinstance(asked, list) or not asked:
        return list(available)
    names = [o.get("name") if isinstance(o, dict) else None for o in asked]
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ProtocolError(f"no output {unknown[0]!r}; this model has {', '.join(available)}")
    return names  # type: ignore[return-value]


def encode(datatype: str, data: list) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(v := str(s).encode())) + v for s in data)
    return np.asarray([np.nan if v is None else v for v in data], dtype=NUMERIC[datatype]).tobytes()


def answer(head: dict[str, Any], outputs: list[dict[str, Any]], binary: set[str]) -> tuple[bytes, int | None]:
    """The response body and, when any output is binary, the JSON header's length (for HEADER)."""
    parts: list[bytes] = []
    for output in outputs:
        if output["name"] in binary:
            raw = encode(output["datatype"], output.pop("data"))
            output["parameters"] = {"binary_data_size": len(raw)}
            parts.append(raw)
    header = orjson.dumps({**head, "outputs": outputs})
    if not parts:
        return header, None
    return header + b"".join(parts), len(header)
