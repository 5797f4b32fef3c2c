"""JSON lines from Arrow record batches, built by Arrow's own string kernels: each value formatted once, in C.

pandas' ``to_json`` (what the worker used before) formats float64 to 15 significant digits, so a prediction such as
0.009009009009009009 came back as 0.009009009009009, at more than twice the CPU (docs/benchmarks.md). Arrow
casts a float to its shortest round-trip text (float32 as float32: ``0.1``, not ``0.10000000149``), so every value
reads back exactly as written. A batch with a column type this module does not format (timestamps, nested
types), or a text column that needs escapes beyond ``\\`` and ``"``, is written by pandas instead.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Text values with a control character need \\uXXXX escapes Arrow cannot write: such a batch goes to pandas.
_CONTROL = r"[\x00-\x1f]"


def _float_text(column: pa.Array) -> pa.Array:
    text = pc.cast(column, pa.string())
    # A whole number keeps a decimal point (2.0, not 2), so a reader infers the column as floats, as written.
    whole = pc.match_substring_regex(text, r"^-?[0-9]+$")
    text = pc.if_else(whole, pc.binary_join_element_wise(text, ".0", ""), text)
    # NaN and infinities are not JSON: null, as pandas wrote them.
    return pc.if_else(pc.is_finite(column), text, pa.scalar(None, pa.string()))


def _value_text(column: pa.Array) -> pa.Array | None:
    """Each value as JSON text (None for a null), or None when this column type is not formatted here."""
    kind = column.type
    if pa.types.is_dictionary(kind):
        column, kind = column.dictionary_decode(), kind.value_type
    if pa.types.is_floating(kind):
        text = _float_text(column)
    elif pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        text = pc.cast(column, pa.string())
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        column = column.cast(pa.string())
        if pc.any(pc.match_substring_regex(column, _CONTROL)).as_py():
            return None
        escaped = pc.replace_substring(pc.replace_substring(column, "\\", "\\\\"), '"', '\\"')
        text = pc.binary_join_element_wise('"', escaped, '"', "")
    else:
        return None
    return pc.fill_null(text, "null")


def batch_lines(batch: pa.RecordBatch) -> pa.Buffer | None:
    """The batch as JSON lines, one object per row keyed by column name, each line ending in a newline; None when
    a column cannot be formatted here (the caller writes the batch another way)."""
    if batch.num_rows == 0:
        return pa.py_buffer(b"")
    parts: list[pa.Array | str] = []
    for index, field in enumerate(batch.schema):
        values = _value_text(batch.column(index))
        if values is None:
            return None
        parts += [("{" if index == 0 else ",") + json.dumps(field.name) + ":", values]
    parts.append("}\n")
    lines = pc.binary_join_element_wise(*parts, "")
    # Every line ends in its newline (and none is null), so the lines' data buffer is the text itself.
    _, offsets, data = lines.buffers()
    bounds = np.frombuffer(offsets, dtype=np.int32)[lines.offset : lines.offset + len(lines) + 1]
    return data.slice(int(bounds[0]), int(bounds[-1] - bounds[0]))
