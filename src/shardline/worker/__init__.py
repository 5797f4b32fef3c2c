"""Shardline's inference worker: the code that runs inside each processing instance.

It reads its share of input files, fans file-level inference over every core (or one
worker per GPU), and writes one output per input. It never imports Airflow.
Run ``python -m shardline.worker --help`` for the command line.

It is in five parts, each a package whose docstring names its modules:

- :mod:`.job`: one instance's job: the command line, the run, its summary and manifest, the ledger's side off the
  hot path, and each output's upload as its file finishes. Its exit codes are the contract's
  (:mod:`shardline.contract`).
- :mod:`.pool`: the process pool, driving a pure scheduler (the queue, suspects and poison), and what runs in each
  pool process: the devices, and the forkserver that preloads the model.
- :mod:`.model`: the model: its kinds, the features it gets, one batch through it and its checks, what a library or
  script says while it predicts (the guards), and a user's custom inference script.
- :mod:`.io`: its files: which to process and how to cut them into work units, the formats read and written as
  record batches, the row-by-row readers a bad line sends a file to, and the rows a file may reject under
  ``tolerance.rows``.
- :mod:`.tools`: what runs instead of the job: ``--preview`` and ``--tune``.
"""

import time

from shardline import __version__  # the distribution's one version

# When this worker's Python began importing it: the instance's start, as far as the worker can know it (its container's
# start before that is SageMaker's). Each SHARD item records it once, so the run report bills an instance from its
# start-up (model load included), not from its first file.
STARTED_AT = time.time()

__all__ = ["STARTED_AT", "__version__"]
