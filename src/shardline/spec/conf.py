"""What a run's conf (the trigger form's Params, or `shardline rerun --conf`) may hold, checked in Python
as the Params' own schema checks it in the form: the DAG factory builds the Params from these, the plan task
and the on-call CLI check a conf with them, and each problem names the Param and what it allows."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from shardline.spec import MAX_INSTANCE_COUNT, TRIGGER_PARAMS, VERSION_PATTERN, PipelineSpec, StepSpec, static_prefix


def _regex_literal(text: str) -> str:
    # Escapes only what JSON Schema's (ECMA) and Python's regexes both read as special.
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", text)


def input_prefix_param_pattern(step: StepSpec) -> str:
    """The JSON-schema pattern of the ``input_prefix`` Param: empty, or a folder under the step's own prefix.

    No segment may be empty, ``.`` or ``..``, so the override cannot climb out of that folder.
    """
    segment = r"(?!\.\.?(?:/|$))[^/\s]+"
    return rf"^$|^{_regex_literal(static_prefix(step.input.prefix or ''))}(?:{segment}/)*(?:{segment})?$"


def input_prefix_param_problem(step: StepSpec, uri: str) -> str | None:
    """Why ``uri`` may not replace the step's input prefix, or None when it may (the Param's rule, in Python)."""
    allowed = static_prefix(step.input.prefix or "")
    if not uri.startswith(allowed):
        return (
            f"Param input_prefix {uri!r} is outside this pipeline's input folder {allowed}; the spec allows "
            "only prefixes under it"
        )
    rest = uri[len(allowed) :]
    parts = rest.split("/")
    if any(p in ("", ".", "..") for p in parts[:-1]) or parts[-1] in (".", "..") or re.search(r"\s", rest):
        return (
            f"Param input_prefix {uri!r} has an empty, '.' or '..' segment or white space; give a plain folder "
            f"under {allowed}"
        )
    return None


def partition_override_problem(step: StepSpec, uri: str, run_prefix: str, pipeline: str) -> str | None:
    """Why ``uri`` may not replace this run's input prefix (``run_prefix``, the spec's rendered for the run), or
    None. When the spec's prefix names a partition (it is templated), the run writes its outputs, and the
    ``_SUCCESS`` that says the partition is complete, to that partition's output prefix: an override must stay
    inside the run's own partition, or another's rows would be taken for this one's."""
    spec_prefix = step.input.prefix or ""
    if static_prefix(spec_prefix) == spec_prefix or not run_prefix:
        return None  # one input folder for every run: no partition to mix up
    folder = run_prefix if run_prefix.endswith("/") else run_prefix + "/"
    if uri == run_prefix or uri.startswith(folder):
        return None
    return (
        f"Param input_prefix {uri!r} is not in this run's partition {folder}: the run writes its outputs and "
        "_SUCCESS to that partition's output prefix, which would then hold another partition's rows as if they "
        f"were its own. Score another partition in its own run (`shardline trigger {pipeline} --partition "
        f"START`), or give a folder under {folder}"
    )


def unknown_conf_problem(conf: dict | None, known: tuple[str, ...] = TRIGGER_PARAMS) -> str | None:
    """Why a trigger conf has keys no Param reads (a typo is silently ignored otherwise), or None."""
    import difflib

    unknown = sorted(set(conf or {}) - set(known))
    if not unknown:
        return None
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hints.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    return (
        f"the trigger conf has unknown key(s) {', '.join(hints)}; this pipeline reads only "
        f"{', '.join(known)} (`unknown_conf: warn` in the spec ignores unknown keys)"
    )


def param_type_problem(conf: dict) -> str | None:
    """Why a conf's values would be refused by the trigger form's Params' types and bounds (the schema
    ``dag_factory.params_for`` gives Airflow), or None."""
    count = conf.get("instance_count")
    if count is not None and (
        isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_INSTANCE_COUNT
    ):
        return f"Param instance_count {count!r} must be null or a whole number from 1 to {MAX_INSTANCE_COUNT}"
    if "dry_run" in conf and not isinstance(conf["dry_run"], bool):
        return f"Param dry_run {conf['dry_run']!r} must be true or false"
    if conf.get("input_prefix") is not None and not isinstance(conf["input_prefix"], str):
        return f"Param input_prefix {conf['input_prefix']!r} must be null or a string"
    if "model_version" in conf and not isinstance(conf["model_version"], str):
        return f"Param model_version {conf['model_version']!r} must be a string"
    return None


def instance_count_override(rendered: object, default: int) -> tuple[int, str | None]:
    """The instance_count Param as a task gets it (Jinja renders it: ``'7'``, ``'None'``, ``''``): the count to
    use, and why the value is refused (then the count is ``default``), or None. Checked again where it is used,
    as the Param's schema is checked only at trigger time."""
    text = str(rendered if rendered is not None else "").strip()
    if text in ("", "None"):
        return default, None
    problem = f"Param instance_count {rendered!r} must be null or a whole number from 1 to {MAX_INSTANCE_COUNT}"
    try:
        count = int(text)
    except ValueError:
        return default, problem
    return (count, None) if 1 <= count <= MAX_INSTANCE_COUNT else (default, problem)


def admitted_count_problem(step: StepSpec, count: int, admitted: int | None) -> str | None:
    """Why a run may not use ``count`` instances of ``step``, whose watch Airflow admits by ``admitted`` (the spec's
    instance_count, held as pool slots or counted against resources.max_concurrent_instances), or None."""
    if admitted is None or count <= admitted:
        return None
    return (
        f"Param instance_count {count} is above steps.{step.name}.resources.instance_count ({admitted}), the "
        f"number of {step.resources.instance_type} instances its watch task is admitted by (its pool's slots, or "
        "resources.max_concurrent_instances): a run may ask for fewer instances, never more; raise "
        "resources.instance_count in the spec instead"
    )


def model_version_problem(step: StepSpec, version: str) -> str | None:
    """Why ``version`` may not be the run's ``model_version`` Param, or None when it may."""
    if not re.fullmatch(VERSION_PATTERN, version):
        return f"Param model_version {version!r} must match {VERSION_PATTERN} (one plain path segment)"
    if step.model.versions and version not in step.model.versions:
        return (
            f"Param model_version {version!r} is not pinned in model.versions of step {step.name} "
            f"(pinned: {', '.join(sorted(step.model.versions))})"
        )
    return None


def conf_problem(
    spec: PipelineSpec,
    conf: Mapping | None,
    *,
    params: Mapping | None = None,
    steps: Sequence[StepSpec] | None = None,
    run_prefix: str | None = None,
    admitted: Mapping[str, int | None] | None = None,
) -> str | None:
    """Why a run with this conf would be refused by the trigger form's Params or fail at a plan task, or None: the one
    check the plan task and on-call's ``trigger`` and ``rerun`` make, each problem naming the Param.

    ``params``: the run's Params as its tasks read them (the conf over the form's defaults; the conf itself when not
    given). ``steps``: the steps checked (every step by default; a plan task checks its own). ``run_prefix``: the first
    step's input prefix rendered for the run, when its partition is known (an ``input_prefix`` override must stay in
    it). ``admitted``: per step name, the most instances its watch task is admitted by (:func:`~shardline.spec.fleet.
    admitted_instances`)."""
    conf = dict(conf or {})
    if spec.unknown_conf == "fail" and (unknown := unknown_conf_problem(conf)):
        return unknown
    if problem := param_type_problem(conf):
        return problem
    values = conf if params is None else params
    override = str(values.get("input_prefix") or "").strip()
    for step in steps or spec.steps:
        if override and step.name == spec.steps[0].name:  # only the first step reads the input_prefix Param
            problem = input_prefix_param_problem(step, override) or (
                partition_override_problem(step, override, run_prefix, spec.pipeline) if run_prefix else None
            )
            if problem:
                return problem
        version = str(values.get("model_version") or "").strip() or step.model.version
        count, problem = instance_count_override(values.get("instance_count"), step.resources.instance_count)
        problem = (
            model_version_problem(step, version)
            or problem
            or admitted_count_problem(step, count, (admitted or {}).get(step.name))
        )
        if problem:
            return problem
    return None
