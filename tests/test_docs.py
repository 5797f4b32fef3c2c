"""The user docs: a short README, a spec reference that cannot go stale, and no lab-notebook text.

`make test` also builds the site with `mkdocs build --strict`, so a broken link or page fails it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from shardline.spec import parse_spec

REPO = Path(__file__).resolve().parents[1]
USER_DOCS = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]


def test_the_readme_is_read_in_five_minutes():
    assert len((REPO / "README.md").read_text().splitlines()) <= 200


def test_the_spec_reference_is_regenerated_whenever_a_field_changes():
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "spec_reference.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_spec_reference_check_fails_on_a_changed_description(monkeypatch):
    """The check compares with the schema itself: a description changed in code makes the page stale."""
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import spec_reference
    finally:
        sys.path.remove(str(REPO / "tools"))
    from shardline import spec

    before = spec_reference.render()
    field = spec.Resources.model_fields["instance_type"]
    monkeypatch.setattr(field, "description", "a description changed without regenerating")
    for model in (spec.Resources, spec.StepSpec, spec.PipelineSpec):
        model.model_rebuild(force=True)
    try:
        assert "a description changed without regenerating" in spec_reference.render()
    finally:
        monkeypatch.undo()
        for model in (spec.Resources, spec.StepSpec, spec.PipelineSpec):
            model.model_rebuild(force=True)
    assert spec_reference.render() == before


def test_the_readmes_pipeline_spec_is_a_valid_spec():
    text = (REPO / "README.md").read_text()
    [block] = re.findall(r"```yaml\n(# dags/pipelines/.*?)```", text, re.S)
    parse_spec(yaml.safe_load(block), "README.md")


@pytest.mark.parametrize("page", USER_DOCS, ids=lambda p: p.name)
def test_user_docs_carry_no_lab_notebook_text(page):
    text = page.read_text()
    for pattern in (
        r"\bthis session\b",
        r"\bissue \d+\b",
        r"\bstop \d+\b",
        r"(?<!sha256 )(?<![0-9a-z-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}(?![0-9a-z-])",
    ):
        found = re.search(pattern, text, re.IGNORECASE if "session" in pattern else 0)
        assert not found, f"{page.name}: {found.group(0)!r} is lab-notebook text, not user docs"


def test_every_test_file_the_docs_cite_exists():
    """The docs point readers at the tests that prove a claim (docs/security.md's table, benchmarks.md): a path that
    moved is a claim without its proof. A function named after ``::`` is checked too (a ``*`` ends a prefix)."""
    pages = [REPO / "README.md", REPO / "ARCHITECTURE.md", *sorted((REPO / "docs").rglob("*.md"))]
    cited = 0
    for page in pages:
        for path, test in re.findall(r"\b(tests/[\w/]+\.py)(?:::(\w+\*?))?", page.read_text()):
            cited += 1
            file = REPO / path
            assert file.is_file(), f"{page.name} cites {path}, which does not exist"
            if test:
                names = re.findall(r"^(?:async )?def (\w+)", file.read_text(), re.M)
                assert any(n == test or (test.endswith("*") and n.startswith(test[:-1])) for n in names), (
                    f"{page.name} cites {path}::{test}, which is not a test there"
                )
    assert cited > 10, cited  # the check reads the citations, not nothing
