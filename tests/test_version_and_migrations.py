"""One version everywhere (`gpusched --version`, `GET /api/version/`, the
admin's header), and the migration check `make lint` runs: a migration the
previous release's processes cannot live with fails unless accepted with
its reason."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db.migrations.loader import MigrationLoader

from gpusched.version import version
from gpusched_client.cli import main
from queueapp.management.commands import lint_migrations

pytestmark = [pytest.mark.django_db, pytest.mark.database_server]


def test_the_command_line_api_and_admin_show_the_same_version(api, admin_client):
    assert version()[0].isdigit()
    printed = CliRunner().invoke(main, ["--version"])
    assert printed.exit_code == 0 and printed.output.strip() == f"gpusched, version {version()}"
    answer = api.get("/api/version/")
    assert answer.status_code == 200  # public, like the health check
    assert answer.json()["version"] == version()
    last = max(name for app, name in MigrationLoader(None).disk_migrations if app == "queueapp")
    assert answer.json()["migration"] == last
    assert f"gpusched {version()}" in admin_client.get("/admin/").content.decode()


def test_every_migration_is_backward_compatible_or_accepted(capsys):
    call_command("lint_migrations")
    assert "backward compatible" in capsys.readouterr().out


def test_an_incompatible_migration_not_accepted_fails(monkeypatch):
    accepted = dict(lint_migrations.ACCEPTED)
    del accepted["0015_gpus"]  # drops a table the previous release read
    monkeypatch.setattr(lint_migrations, "ACCEPTED", accepted)
    with pytest.raises(CommandError, match="cannot live with"):
        call_command("lint_migrations")


def test_an_accepted_migration_that_no_longer_exists_fails(monkeypatch):
    monkeypatch.setattr(lint_migrations, "ACCEPTED", {"0999_gone": "a reason"})
    with pytest.raises(CommandError, match="0999_gone"):
        call_command("lint_migrations")
