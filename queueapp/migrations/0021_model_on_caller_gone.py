"""A model's `on_caller_gone` (what a front-door caller's hang-up does to its
running request), and on the job when its caller left and how long the GPU
was drained after that."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("queueapp", "0020_work_conservation"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="caller_left_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="drained_seconds",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="modelsetting",
            name="on_caller_gone",
            field=models.CharField(
                blank=True,
                choices=[("close", "Close"), ("drain", "Drain")],
                default="",
                help_text="When a front-door caller hangs up mid-run: close (the request is closed; llama-server stops) or drain (llama-swap's answer is read to its end and discarded, the GPU held until then). Blank: drain for images, audio and /sdapi/, close for the other paths.",
                max_length=8,
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
                    ("requeued", "Requeued"),
                    ("returned_to_queue", "Returned To Queue"),
                    ("reclamped", "Reclamped"),
                    ("caller_left", "Caller Left"),
                ],
                max_length=40,
            ),
        ),
    ]
