"""The holder watchdog: a run's `running_long_at`, the policy's minimum, the
`running_long` event, and a minute-by-minute sweep on the `webhooks`
cluster as a safety net (the dispatchers and the web processes that hold a
GPU sweep every few seconds)."""

import django.core.validators
from django.db import migrations, models


def create_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.update_or_create(
        name="running-long-safety-net",
        defaults={
            "func": "queueapp.tasks.report_running_long",
            "schedule_type": "I",  # minutes
            "minutes": 1,
            "repeats": -1,
            "cluster": "webhooks",
        },
    )


def remove_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name="running-long-safety-net").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("queueapp", "0023_priority_by_path"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="running_long_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="policy",
            name="running_long_min_seconds",
            field=models.FloatField(
                default=600.0,
                help_text=(
                    'The holder watchdog reports a running job (one WARNING line, "running '
                    'long" on the dashboard) once it has held its GPU for 3 x its estimate, '
                    "and never before this many seconds."
                ),
                validators=[django.core.validators.MinValueValidator(0)],
            ),
        ),
        migrations.AlterField(
            model_name="jobevent",
            name="kind",
            field=models.CharField(
                choices=[
                    ("submitted", "Submitted"),
                    ("started", "Started"),
                    ("succeeded", "Succeeded"),
                    ("failed", "Failed"),
                    ("cancelled", "Cancelled"),
                    ("expired", "Expired"),
                    ("requeued", "Requeued"),
                    ("returned_to_queue", "Returned To Queue"),
                    ("reclamped", "Reclamped"),
                    ("caller_left", "Caller Left"),
                    ("running_long", "Running Long"),
                ],
                max_length=40,
            ),
        ),
        migrations.RunPython(create_schedule, remove_schedule),
    ]
