"""Every minute, the `webhooks` cluster sets again the stored estimates of
queued jobs that the runs learned meanwhile moved far
(queueapp/services/expectations.py)."""

from django.db import migrations


def create_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.update_or_create(
        name="queued-expectations-refresh",
        defaults={
            "func": "queueapp.tasks.refresh_expectations",
            "schedule_type": "I",  # minutes
            "minutes": 1,
            "repeats": -1,
            "cluster": "webhooks",
        },
    )


def remove_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(
        name="queued-expectations-refresh"
    ).delete()


class Migration(migrations.Migration):
    dependencies = [("queueapp", "0032_shorter_first_inside_a_band")]

    operations = [migrations.RunPython(create_schedule, remove_schedule)]
