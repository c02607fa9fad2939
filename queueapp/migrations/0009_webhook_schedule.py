"""Every minute, the `webhooks` cluster sends deliveries that fell due
(retries hours apart, deliveries left over by a restart)."""

from django.db import migrations


def create_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.update_or_create(
        name="webhook-delivery-safety-net",
        defaults={
            "func": "queueapp.tasks.deliver_webhooks",
            "schedule_type": "I",  # minutes
            "minutes": 1,
            "repeats": -1,
            "cluster": "webhooks",
        },
    )


def remove_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(
        name="webhook-delivery-safety-net"
    ).delete()


class Migration(migrations.Migration):
    dependencies = [("queueapp", "0008_webhooks")]

    operations = [migrations.RunPython(create_schedule, remove_schedule)]
