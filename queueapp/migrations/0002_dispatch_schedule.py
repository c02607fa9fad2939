"""A django-q2 schedule that runs a dispatch pass every minute.

Submissions wake the GPU worker directly; this is the safety net that
re-queues a dead dispatcher's job and retries when nothing else wakes it.
"""

from django.db import migrations


def create_schedule(apps, schema_editor):
    Schedule = apps.get_model("django_q", "Schedule")
    Schedule.objects.update_or_create(
        name="gpu-dispatch-safety-net",
        defaults={
            "func": "queueapp.tasks.dispatch",
            "schedule_type": "I",  # minutes
            "minutes": 1,
            "repeats": -1,
            "cluster": "gpu",
        },
    )


def remove_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name="gpu-dispatch-safety-net").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("queueapp", "0001_initial"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(create_schedule, remove_schedule)]
