"""Once a day, the `webhooks` cluster prunes finished jobs past the retention
period (GPUSCHED_RETENTION_DAYS; docs/architecture.md, "Retention and pruning")."""

from django.db import migrations


def create_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.update_or_create(
        name="job-retention-prune",
        defaults={
            "func": "queueapp.tasks.prune_finished_jobs",
            "schedule_type": "D",  # daily
            "repeats": -1,
            "cluster": "webhooks",
        },
    )


def remove_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name="job-retention-prune").delete()


class Migration(migrations.Migration):
    dependencies = [("queueapp", "0009_webhook_schedule")]

    operations = [migrations.RunPython(create_schedule, remove_schedule)]
