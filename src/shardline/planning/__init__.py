"""Planning a step: which inputs, in what order, under which deterministic names, as which request.

Pure builders, and the S3 listing they start from (through a boto3 client the caller hands in):

- :mod:`.attempt`: the typed ``Attempt`` every layer passes. Its job name, manifest URI and
  instance count are derived here, and it travels to and from XCom and the ledger.
- :mod:`.inputs`: list a step's inputs, refuse unsafe keys, and order them for the deal; write the manifest and
  the plan file (an attempt's inputs and their sizes).
- :mod:`.naming`: deterministic job names and keys, so a retried task finds the job its earlier try started.
- :mod:`.request`: the pure CreateProcessingJob builder, spec in, dict out.
- :mod:`.arrivals`: which partitions a batch of ready-marker events completes (``partitions_started``), and how an
  SQS message reads as S3 events (``markers_in``).
"""
