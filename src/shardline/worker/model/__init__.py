"""The model: what it is, what it gets, and one batch through it. The files it reads are :mod:`shardline.worker.io`'s.

- :mod:`.loading`: the model kinds: verify, unpack and load an artifact as a predictor.
- :mod:`.features`: which columns of a file the model gets, in which order, and why.
- :mod:`.predict`: one batch through the model, and its checks.
- :mod:`.guards`: what a model library or script says while it predicts, and which of it is an error.
- A user's custom inference.py, run as SageMaker runs it: :mod:`.script_codec` (its request bodies and how its
  responses are read) and :mod:`.script_runner` (calling it).
"""
