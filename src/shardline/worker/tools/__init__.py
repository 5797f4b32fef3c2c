"""What runs instead of the job.

- :mod:`.preview`: ``--preview``, the model on a sample, with the job's own settings, and warnings about a wrong
  setup.
- :mod:`.tune`: ``--tune``, rows/s per workers x threads and per batch rows on a sample, and the spec snippet.
  Its decisions are pure, in :mod:`.tune_decisions`; its sample is :mod:`.tune_sample`; its table, text and plot
  are :mod:`.tune_report`.
"""
