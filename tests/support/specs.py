"""A minimal valid pipeline spec, as a dict the spec tests change one field of, and its first step parsed."""

from __future__ import annotations

from shardline.spec import StepSpec, parse_spec

SHA = "0" * 64
OTHER = "b" * 64


def minimal(**overrides) -> dict:
    spec = {
        "pipeline": "tabular_scoring",
        "schedule": "@hourly",
        "steps": [
            {
                "name": "score",
                "model": {"uri": "s3://models/xgb/model.tar.gz", "sha256": SHA},
                "input": {"prefix": "s3://data/raw/dt={{ ds }}/", "passthrough": ["id"]},
                "output": {"prefix": "s3://data/scores/dt={{ ds }}/"},
            }
        ],
    }
    spec.update(overrides)
    return spec


def with_model(**model) -> dict:
    """``minimal()`` whose step's model is exactly ``model``."""
    data = minimal()
    data["steps"][0]["model"] = model
    return data


def first_step(prefix: str, **model) -> StepSpec:
    """The first step of ``minimal()`` reading ``prefix``, its model's settings updated with ``model``."""
    data = minimal()
    data["steps"][0]["input"]["prefix"] = prefix
    data["steps"][0]["model"].update(model)
    return parse_spec(data, "p.yaml").steps[0]
