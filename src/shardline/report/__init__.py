"""The run report: what a step did, cost and predicted, from the ledger's records. Pure: records in, data and HTML out.

- :mod:`.histogram`: the mergeable prediction histogram a worker keeps while it writes (DDSketch-style).
- :mod:`.profile`: the mergeable profile of each output column (and each input feature the checks name) a worker
  keeps per file while it writes: rows, nulls, a histogram or the labels.
- :mod:`.checks`: the step's output checks (its spec's ``checks``) evaluated against the merged profile and the
  last successful partitions'.
- :mod:`.drift`: the population stability index (PSI) of a run's predictions against a reference run's.
- :mod:`.cost`: the shipped price table of SageMaker Processing instance types, and cost per 1M predictions.
- :mod:`.quote`: a step's cost before it runs, fitted to earlier runs' reports (or a sample): a range and an
  expected figure.
- :mod:`.inputs`: the plain records a report is built from: the ledger's ``FileRecord`` per file, counted, and an
  ``InstanceRecord`` per SHARD record; ``records_from_ledger`` makes them from one step's ledger records.
- :mod:`.model`: the typed ``RunReport`` and its JSON (``to_json``, ``from_json``).
- :mod:`.build`: ``build_report``, records in, a ``RunReport`` out.
- :mod:`.render`: ``render_html``, the self-contained HTML page.
- :mod:`.charts`: ``render_charts``, the page's charts as SVG, drawn by hand (no plotting library).

Import each name from its module: the package itself loads nothing, so no numpy.
"""
