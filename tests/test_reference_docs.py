"""The reference pages of docs/ follow the code, so they cannot drift from it.

The environment page names every variable the settings read (found by
reading the settings' source, and the project modules it imports, not by a
hand list), the policy page every field of the `Policy` model, the metrics
page every metric `/metrics` serves, and the HTTP API page is what the
OpenAPI schema renders now. The README stays a front page, and every page
of docs/ is in the site's nav.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError

from queueapp.models import Policy
from queueapp.models.members import Tier
from tests.environment_reads import environment_variables_read

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_MAX_LINES = 250


def _table_keys(page: Path) -> set[str]:
    """The backticked words in the first column of the page's tables."""
    keys = set()
    for line in page.read_text().splitlines():
        if line.startswith("| `"):
            keys.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return keys


def test_the_environment_page_names_every_variable_the_settings_read():
    documented = _table_keys(DOCS / "reference" / "environment.md")
    assert sorted(environment_variables_read() - documented) == []


def test_the_settings_reader_finds_variables_read_every_way():
    found = environment_variables_read()
    # A literal key, a helper's key, a constant's key in an imported module,
    # and a module imported inside a block (the embedded PostgreSQL's).
    assert {"DATABASE_URL", "GPUSCHED_CONN_MAX_AGE", "ALLOWED_HOSTS"} <= found
    assert {"LLAMA_SWAP_API_KEY", "LLAMA_SWAP_API_KEY_FILE", "LLAMA_SWAP_CONFIG"} <= found
    assert "GPUSCHED_PGDATA" in found


def test_the_policy_page_names_every_policy_field():
    fields = {field.name for field in Policy._meta.concrete_fields if not field.primary_key}
    assert fields >= set(Policy.EDITABLE_FIELDS)
    documented = _table_keys(DOCS / "reference" / "policy-fields.md")
    assert sorted(fields - documented) == []


def test_the_policy_page_names_every_tier_field():
    fields = {field.name for field in Tier._meta.concrete_fields if not field.primary_key}
    documented = _table_keys(DOCS / "reference" / "policy-fields.md") | {"name"}
    assert sorted(fields - documented) == []


def test_the_metrics_page_names_every_metric():
    source = (ROOT / "queueapp" / "metrics.py").read_text()
    metrics = set(re.findall(r'"(gpusched_\w+)"', source))
    assert len(metrics) > 10
    documented = _table_keys(DOCS / "reference" / "metrics.md")
    assert sorted(metrics - documented) == []


def test_the_api_page_is_what_the_schema_renders_now():
    call_command("api_reference", check=True)


def test_the_api_check_fails_for_a_page_that_drifted(tmp_path):
    stale = tmp_path / "api.md"
    stale.write_text((DOCS / "reference" / "api.md").read_text() + "\nan endpoint that is gone\n")
    with pytest.raises(CommandError, match="not current"):
        call_command("api_reference", out=stale, check=True)


def test_the_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    for command in ("make run", "make test"):
        assert f"`{command}`" in readme or f"{command} " in readme


def _nav_pages(nav: list) -> set[str]:
    pages = set()
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            pages |= _nav_pages(value) if isinstance(value, list) else {value}
    return pages


def test_every_page_of_docs_is_in_the_nav_and_every_nav_page_exists():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    pages = {str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md")}
    assert sorted(pages - nav) == []
    assert sorted(nav - pages) == []


def test_every_docs_link_of_the_readme_leads_to_a_file():
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert targets
    assert [target for target in targets if not (ROOT / target).exists()] == []
