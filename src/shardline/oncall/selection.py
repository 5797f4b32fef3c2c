"""Which files a resubmission takes, as pure functions over the step's files already read from the
ledger (:class:`~shardline.oncall.views.FileView`) and, for an instance, the attempt's manifest.

``--all-failed`` takes every file that has not succeeded; ``--instance algo-2`` the unfinished or
failed files that instance had in the newest attempt; ``--file KEY`` the named ones. A file that
succeeded is never taken again, and neither is a key the planner refused as an unsafe path (it
can never run). No AWS client, no Airflow: :mod:`shardline.oncall.service` reads, then asks here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shardline import contract
from shardline.decision.policy import UNSAFE_KEY_ERROR
from shardline.ledger.states import FileStatus
from shardline.oncall.errors import BadRequest
from shardline.oncall.values import FileChoice, FileView, ResubmitPlan
from shardline.planning.attempt import Attempt


def resubmittable(files: Iterable[FileView]) -> dict[str, FileView]:
    """The files that may run again, by input key: not succeeded, and not refused as an unsafe path."""
    return {f.input_key: f for f in files if f.status != FileStatus.SUCCEEDED and f.error_class != UNSAFE_KEY_ERROR}


def needs_deal(files: Iterable[FileView], attempt: int) -> bool:
    """Whether an instance's files can only be told from the attempt's manifest: some file of the attempt that
    may run again was never claimed, so the ledger does not say which instance had it."""
    return any(f.host is None for f in resubmittable(files).values() if f.attempt == attempt)


def dealt_hosts(manifest: Sequence[Any], attempt: Attempt) -> dict[str, str]:
    """Which instance each entry of ``attempt``'s input manifest went to (the deal is round robin).

    ``manifest`` is the manifest's JSON as written (``planning.inputs.manifest_body``): the common
    prefix, then each key relative to it.
    """
    prefix, entries = manifest[0]["prefix"], list(manifest[1:])
    instances = attempt.model_copy(update={"file_count": len(entries)}).instance_count
    return {
        prefix + entry: contract.host_name(i)
        for i, share in enumerate(contract.deal(entries, instances))
        for entry in share
    }


def full_key(known: Iterable[str], key: str) -> str:
    """Accept a full s3:// URI, or a key relative to the step's input prefix (when exactly one input ends so)."""
    if key.startswith("s3://"):
        return key
    matches = [k for k in known if k.endswith("/" + key.lstrip("/"))]
    return matches[0] if len(matches) == 1 else key


def choose_files(
    ref: str,
    step: str,
    attempt: int,
    files: Sequence[FileView],
    choice: FileChoice,
    dealt: Mapping[str, str] | None = None,
) -> ResubmitPlan:
    """Which of the step's ``files`` a resubmission takes, and why.

    ``attempt`` is the step's newest; ``dealt`` says where that attempt's manifest dealt each file
    (:func:`dealt_hosts`), needed for an instance only when :func:`needs_deal` says so. Raises
    :class:`BadRequest` for a choice that is not exactly one way, or names a file that is no
    input of the step.
    """
    choice.check()
    if choice.rejects:
        raise ValueError("--rejects chooses rows from the step's rejects parts (resubmission._rejects_plan)")
    instance, keys = choice.instance, choice.files
    not_done = resubmittable(files)
    if choice.all_failed:
        chosen, why = sorted(not_done), "every file that has not succeeded"
    elif instance:
        # Hosts are per attempt (algo-1 of attempt 2 is another machine than algo-1 of attempt 1),
        # so only the newest attempt's files count; those never claimed went where the manifest dealt them.
        newest = {k: f for k, f in not_done.items() if f.attempt == attempt}
        dealt = dealt or {}
        chosen = sorted(k for k, f in newest.items() if (f.host or dealt.get(k)) == instance)
        why = f"the unfinished or failed files of instance {instance} (attempt {attempt})"
    else:
        known = {f.input_key for f in files}
        wanted = [full_key(known, key) for key in keys]
        unknown = [k for k, w in zip(keys, wanted, strict=True) if w not in known]
        if unknown:
            raise BadRequest(
                f"{', '.join(map(repr, unknown))} {'is' if len(unknown) == 1 else 'are'} not an "
                f"input of step {step}; `shardline failed {ref} --step {step}` lists the files "
                "that can be resubmitted (pass one as --file, or use --all-failed)"
            )
        chosen = sorted(w for w in wanted if w in not_done)
        why = "the chosen files that have not succeeded"
    return ResubmitPlan(ref, step, chosen, why)
