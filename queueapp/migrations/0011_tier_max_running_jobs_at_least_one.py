import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("queueapp", "0010_retention_schedule"),
    ]

    operations = [
        migrations.AlterField(
            model_name="tier",
            name="max_running_jobs",
            field=models.PositiveIntegerField(
                default=1,
                help_text="Jobs of one member running at once, at least 1. One GPU runs one "
                "job at a time, so today every value behaves like 1; the limit is for several "
                "GPU slots.",
                validators=[
                    django.core.validators.MinValueValidator(
                        1,
                        message="must be at least 1: a tier's jobs cannot be held with this "
                        "limit (to hold every queued job, pause dispatch in the policy)",
                    )
                ],
            ),
        ),
        # 0 was never enforced (it behaved like 1), so 1 keeps what it did.
        migrations.RunSQL(
            "UPDATE queueapp_tier SET max_running_jobs = 1 WHERE max_running_jobs < 1",
            reverse_sql=migrations.RunSQL.noop,
        ),
        migrations.AddConstraint(
            model_name="tier",
            constraint=models.CheckConstraint(
                condition=models.Q(("max_running_jobs__gte", 1)),
                name="tier_max_running_jobs_at_least_one",
                violation_error_message="max_running_jobs must be at least 1",
            ),
        ),
    ]
