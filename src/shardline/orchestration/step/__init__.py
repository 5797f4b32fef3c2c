"""One owner for a step's life, from its plan to its end. The Airflow tasks and on-call call these same functions.

- :mod:`.plan`: attempt 1, and every later attempt's records, plan file and manifest.
- :mod:`.preview`: a step's model on the first rows of one input, before launch (``shardline preview``, the plan
  task's dry run, ``shardline tune``).
- :mod:`.upstream`: what a ``from_step`` step reads: exactly the outputs its earlier step's outputs manifest lists.
- :mod:`.jobs`: submit, stop, resubmit, resume. Two attempts of a step never run at once.
- :mod:`.capacity`: what AWS's refusals change in a step: why a planned job is not running yet, recorded on the
  STEP item as data (``decision.fleet.Waiting``; the views render it), and the attempt after a capacity failure.
- :mod:`.watch`: what a poll reads and decides (``snapshot``, ``decide_now``, ``input_ready``; a poll AWS
  throttled is taken again, ``is_throttled``), and the JSON values a trigger carries instead of a spec:
  ``StepEvent`` (the decision it hands back, on the one ``Action`` enum), ``StepWatch`` (the AWS settings and the
  decision policy an attempt started with), ``InputWatch`` and ``PartitionWatch``.
- :mod:`.end`: ``conclude``, what the watch's decision becomes, recorded and returned as a typed ``StepEnd``;
  ``finish``; and the step's summary.
- :mod:`.outputs`: what a step's end checks and commits: every output's object against the ledger's size and
  sha256, the last look for late or replaced inputs, the outputs manifest, ``_SUCCESS``.
- :mod:`.rejects`: ``resubmit --rejects``. A file's rejected rows are picked by number from its mended source into
  a part the next attempt scores; readers fold a part into its file (``ledger.records.settle_parts``).
- :mod:`.run_report`: gathers a step's records (the ledger, the instances' manifests, the earlier runs' reports),
  evaluates its output checks and writes its run report.
- :mod:`.baseline`: a step's reference profile made once from a file (``shardline checks baseline``).
- :mod:`.approval`: on-call's acceptance of outputs the blocking checks held back, recorded on the STEP item and
  honoured by the step's end.
- :mod:`.files`: a step's files as every reader sees them: its FILE items, plus the inputs its attempts' plan
  files name that no instance has claimed yet (PENDING), and its latest attempt.
"""
