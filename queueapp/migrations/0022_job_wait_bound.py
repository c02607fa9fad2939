"""Wait bounds: a job's `wait_deadline`, the policy's default bound per band,
the `expired` status and event, the index the expiry sweep reads, and a
minute-by-minute sweep on the `webhooks` cluster as a safety net (the
dispatchers and the front door's gateways sweep every second or so)."""

from django.db import migrations, models


def create_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.update_or_create(
        name="wait-bound-expiry-safety-net",
        defaults={
            "func": "queueapp.tasks.expire_overdue_jobs",
            "schedule_type": "I",  # minutes
            "minutes": 1,
            "repeats": -1,
            "cluster": "webhooks",
        },
    )


def remove_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(
        name="wait-bound-expiry-safety-net"
    ).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("queueapp", "0021_model_on_caller_gone"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="wait_deadline",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="policy",
            name="max_wait_by_band",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text=(
                    "Default wait bound per band, in seconds, for jobs sent without "
                    'X-Gpusched-Max-Wait, e.g. {"100": 30, "-100": 3600} (aliases allowed as '
                    "keys); a job that cannot start within it is refused, one that waits past "
                    "it expires. Empty: no default bound."
                ),
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="status",
            field=models.CharField(
                choices=[
                    ("queued", "Queued"),
                    ("running", "Running"),
                    ("succeeded", "Succeeded"),
                    ("failed", "Failed"),
                    ("cancelled", "Cancelled"),
                    ("expired", "Expired"),
                ],
                default="queued",
                max_length=16,
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
                ],
                max_length=40,
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("wait_deadline"),
                condition=models.Q(("status", "queued"), ("wait_deadline__isnull", False)),
                name="job_queued_wait_deadline",
            ),
        ),
        migrations.RunPython(create_schedule, remove_schedule),
    ]
