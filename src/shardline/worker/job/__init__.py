"""One instance's job, from its command line to its exit code.

- :mod:`.cli`: the command line (``python -m shardline.worker``): its flags, signals and logging.
- :mod:`.run`: the job itself: find the instance's files, load the model, run them over the pool, sum them up.
- :mod:`.summary`: what the instance says when its job ends: its summary, its manifest, its log lines.
- :mod:`.ledger_hooks` and :mod:`.ledger_pump`: the ledger's side, off the hot path: file claims and ends,
  heartbeats and fencing, written in order by one background thread.
- :mod:`.uploads`: each output to S3 as its file finishes, before its file is recorded SUCCEEDED.
"""
