"""The policy's band by path, for calls that name none: speech and
transcriptions interactive, the rest normal. The existing policy row gets
those defaults."""

from django.db import migrations, models

import queueapp.policy.priority


class Migration(migrations.Migration):
    dependencies = [
        ("queueapp", "0022_job_wait_bound"),
    ]

    operations = [
        migrations.AddField(
            model_name="policy",
            name="priority_by_path",
            field=models.JSONField(
                blank=True,
                default=queueapp.policy.priority.default_priority_by_path,
                help_text=(
                    "The band of a call that names none (no X-LlamaSwap-Priority header, no "
                    '"priority" in its body), by path, e.g. {"/v1/audio/speech": "interactive"} '
                    "(an alias is stored as its band); a path not listed: normal (0)."
                ),
            ),
        ),
    ]
