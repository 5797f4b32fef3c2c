"""The run report: what a step did, cost and predicted, from the ledger's records. Pure: records in, data out.

- ``histogram``: the mergeable prediction histogram a worker keeps while it writes (DDSketch-style).
- ``drift``: the population stability index of a run's predictions against a reference run's.
- ``cost``: the shipped price table of SageMaker Processing instance types, and cost per 1M predictions.
- ``inputs``: the plain records a report is built from, and ``records_from_ledger``.
- ``model``: the typed ``RunReport`` and its JSON (``to_json``, ``from_json``).
- ``build``: ``build_report``, records in, a ``RunReport`` out.
- ``render``: ``render_html``, the self-contained page (matplotlib, imported only when a page is drawn).

Names are resolved lazily, so importing the package loads neither numpy nor matplotlib.
"""

import importlib

_EXPORTS = {
    "Histogram": "shardline.report.histogram",
    "psi": "shardline.report.drift",
    "psi_between": "shardline.report.drift",
    "Drift": "shardline.report.drift",
    "Prices": "shardline.report.cost",
    "UnknownPriceError": "shardline.report.cost",
    "run_cost": "shardline.report.cost",
    "cost_per_million": "shardline.report.cost",
    "FileRecord": "shardline.ledger.records",
    "InstanceRecord": "shardline.report.inputs",
    "StepIdentity": "shardline.report.inputs",
    "PreviousRun": "shardline.report.inputs",
    "RunReport": "shardline.report.model",
    "build_report": "shardline.report.build",
    "records_from_ledger": "shardline.report.inputs",
    "render_html": "shardline.report.render",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'shardline.report' has no attribute {name!r}")
