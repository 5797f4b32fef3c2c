"""Write docs/spec-reference.md from the pipeline spec's own JSON schema (``PipelineSpec``).

    .venv/bin/python tools/spec_reference.py          # write it
    .venv/bin/python tools/spec_reference.py --check  # exit 1 if it is stale (a test runs this)

Every field's description is its docstring or ``Field(description=...)`` in ``src/shardline/spec/__init__.py``:
change it there, then run this.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "spec-reference.md"

# The sections, in the order a spec is read: the pipeline, a step, then a step's and the pipeline's parts.
SECTIONS = [
    ("PipelineSpec", "The pipeline", ""),
    ("StepSpec", "A step", "steps[]."),
    ("ModelRef", "A step's model", "steps[].model."),
    ("InputSpec", "A step's input", "steps[].input."),
    ("OutputSpec", "A step's output", "steps[].output."),
    ("Resources", "A step's resources", "steps[].resources."),
    ("RetryPolicy", "A step's retries", "steps[].retry."),
    ("FailureTolerance", "A step's tolerance", "steps[].tolerance."),
    ("DriftPolicy", "A step's drift check", "steps[].drift."),
    ("ChecksSpec", "A step's output checks", "steps[].checks."),
    ("RowsOutCheck", "The rows-out check", "steps[].checks.rows_out."),
    ("ColumnCheck", "An output column's checks", "steps[].checks.columns.NAME."),
    ("FeatureCheck", "An input feature's checks", "steps[].checks.features.NAME."),
    ("DeadlineSpec", "The deadline", "deadline."),
    ("ArrivalSpec", "Start on arrival", "trigger."),
    ("CostSettings", "Cost", "cost."),
    ("SageMakerSettings", "SageMaker", "sagemaker."),
    ("VpcConfig", "SageMaker's VPC", "sagemaker.vpc."),
]


def _type(prop: dict, defs: dict) -> str:
    if "$ref" in prop:
        return "mapping"
    if "enum" in prop:
        return " \\| ".join(f"`{v}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{prop['const']}`"
    if "anyOf" in prop:
        kinds = [_type(p, defs) for p in prop["anyOf"] if p.get("type") != "null"]
        return " \\| ".join(dict.fromkeys(kinds)) + (
            " or null" if any(p.get("type") == "null" for p in prop["anyOf"]) else ""
        )
    kind = prop.get("type", "any")
    if kind == "array":
        return "list"
    if kind == "object":
        return "mapping"
    bounds = [
        f"{word} {prop[key]}"
        for key, word in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<"))
        if key in prop
    ]
    return {"integer": "integer", "number": "number", "string": "string", "boolean": "boolean"}.get(kind, kind) + (
        f" ({', '.join(bounds)})" if bounds else ""
    )


def _default(prop: dict) -> str:
    if "default" not in prop:
        return "required"
    value = prop["default"]
    if isinstance(value, dict) and value and "$ref" in prop:
        return "see below"  # a section of its own
    if value in ({}, [], None):
        return "unset" if value is None else "empty"
    return f"`{json.dumps(value)}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render() -> str:
    from shardline.spec import PipelineSpec

    schema = PipelineSpec.model_json_schema()
    defs = schema.get("$defs", {})
    models = {"PipelineSpec": schema, **defs}
    out = [
        "# Pipeline spec reference",
        "",
        "Every field of a pipeline spec (`dags/pipelines/*.yaml`), generated from the spec's own schema",
        "(`tools/spec_reference.py`; a test fails when this page is stale). A spec with an unknown or bad",
        "field is an import error in Airflow's UI that names the file and the field.",
        "",
    ]
    for name, title, path in SECTIONS:
        model = models[name]
        out += [f"## {title}", ""]
        if model.get("description") and name != "PipelineSpec":
            out += [_cell(model["description"]), ""]
        out += ["| field | type | default | meaning |", "|---|---|---|---|"]
        required = set(model.get("required", []))
        for field, prop in model.get("properties", {}).items():
            default = "required" if field in required else _default(prop)
            out.append(f"| `{path}{field}` | {_type(prop, defs)} | {default} | {_cell(prop.get('description', ''))} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/spec-reference.md is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = REFERENCE.read_text() if REFERENCE.exists() else ""
        if current != text:
            print(f"{REFERENCE} is stale: run `.venv/bin/python tools/spec_reference.py`", file=sys.stderr)
            return 1
        return 0
    REFERENCE.write_text(text)
    print(f"wrote {REFERENCE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
