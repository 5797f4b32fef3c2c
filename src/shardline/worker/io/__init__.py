"""The files an instance reads and writes: its inputs as streams of record batches, its outputs, and the rows a
file may reject.

- :mod:`.work_units`: which files to process and how to cut them into work units (a large parquet file by row
  groups).
- :mod:`.formats`: the files read and written, as streams of record batches (parquet, CSV, JSON lines).
- :mod:`.json_lines`: JSON lines written by Arrow's own string kernels.
- :mod:`.text_files`: what both text readers share: which line each record starts on, bytes that are not UTF-8.
- :mod:`.tolerant`: the row-by-row CSV and JSON lines readers a bad line sends a file to, with or without
  ``tolerance.rows``.
- :mod:`.rejects`: the rows a file may reject under ``tolerance.rows``, with their lines and reasons.
"""
