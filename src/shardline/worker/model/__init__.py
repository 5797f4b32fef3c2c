"""The model and its data.

- :mod:`.loading`: the model kinds: verify, unpack and load an artifact as a predictor.
- :mod:`.features`: which columns of a file the model gets, in which order, and why.
- :mod:`.formats`: the files read and written, as streams of record batches (parquet, CSV, JSON lines).
- :mod:`.json_lines`: JSON lines written by Arrow's own string kernels.
- :mod:`.predict`: one batch through the model, and its checks.
- :mod:`.rejects`: the rows a file may reject under ``tolerance.rows``, with their lines and reasons.
- :mod:`.tolerant`: the row-by-row CSV and JSON lines readers a bad line sends a file to.
- :mod:`.text_files`: what both text readers share.
- A user's custom inference.py, run as SageMaker runs it: :mod:`.script_codec` (its request bodies and how its
  responses are read) and :mod:`.script_runner` (calling it).
"""
