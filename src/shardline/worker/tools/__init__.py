"""What runs instead of the job: ``preview`` (``--preview``: the model on a sample) and ``tune`` (``--tune``: rows/s
per setting on a sample), with the tune's pure ``tune_decisions``, its ``tune_sample`` and ``tune_report``."""
