"""Planning a step: which inputs, in what order, under which deterministic names, as which request.

Pure builders (``attempt``, the typed value every layer passes; ``naming``; ``request``; the
ordering in ``inputs``) and the S3 listing they start from.
"""
