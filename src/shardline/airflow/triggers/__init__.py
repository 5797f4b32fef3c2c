"""Triggers: all polling of a step (its job and ledger, its backoff, its input) happens here.

They carry JSON values only, never a spec path, and act on nothing themselves.

- :mod:`.step`: ``StepTrigger`` (a step's snapshot, asked of the decision policy until the answer is not WAIT),
  ``BackoffTrigger`` (a wait: a resubmission's backoff, or a refused submit's), ``InputTrigger`` (a step's input
  landing) and ``PartitionTrigger`` (an output prefix another run holds).
- :mod:`.arrival`: ``ReadyMarkerTrigger``, the event trigger of a pipeline started on arrival, over the SQS queue
  that the bucket's S3 event notifications go to.
"""
