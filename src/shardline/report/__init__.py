"""The run report: what a step did, cost and predicted, from the ledger's records. Pure: records in, data out.

- ``histogram``: the mergeable prediction histogram a worker keeps while it writes (DDSketch-style).
- ``drift``: the population stability index of a run's predictions against a reference run's.
- ``cost``: the shipped price table of SageMaker Processing instance types, and cost per 1M predictions.
- ``inputs``: the plain records a report is built from, and ``records_from_ledger``.
- ``model``: the typed ``RunReport`` and its JSON (``to_json``, ``from_json``).
- ``build``: ``build_report``, records in, a ``RunReport`` out.
- ``render``: ``render_html``, the self-contained page (matplotlib, imported only when a page is drawn).

Import each name from its module: the package itself loads nothing, so neither numpy nor matplotlib.
"""
