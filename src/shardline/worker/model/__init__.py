"""The model and its data: ``loading`` (verify, unpack and load an artifact as a predictor), ``features`` (which
columns it gets), ``formats`` (the files read and written), ``predict`` (one batch through it, and the checks),
and a custom ``inference.py``: ``script_codec`` (request bodies and responses) and ``script_runner`` (calling it)."""
