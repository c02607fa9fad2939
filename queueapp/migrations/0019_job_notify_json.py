"""The jobs table's notices become JSON objects, and the trigger's function
moves to one file, queueapp/sql/job_notify.sql, beside its one parser,
queueapp/job_notices.py: a field added to the notice is a key, not a shifted
position, and a test holds the SQL and the parser together.

The file is read as it is when this migration runs: a later change to it
comes with a migration of its own that loads it again, whose reverse is then
the text this one loads, copied there: this file will have changed by then."""

from importlib import import_module
from importlib.resources import files

from django.db import migrations

NOTIFY_FUNCTION = files("queueapp").joinpath("sql/job_notify.sql").read_text(encoding="utf-8")

# The function as migration 0015 left it, for going back.
PREVIOUS_FUNCTION = import_module("queueapp.migrations.0015_gpus").NOTIFY_FUNCTION


class Migration(migrations.Migration):
    dependencies = [
        ("queueapp", "0018_running_limit_counts_gpus"),
    ]

    operations = [migrations.RunSQL(NOTIFY_FUNCTION, PREVIOUS_FUNCTION)]
