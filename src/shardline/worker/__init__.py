"""Shardline's inference worker: the code that runs inside each processing instance.

It reads its share of input files, fans file-level inference over every core (or one
worker per GPU), and writes one output per input. It never imports Airflow.
Run ``python -m shardline.worker --help`` for the command line.
"""

from shardline import __version__  # the distribution's one version

__all__ = ["__version__"]
