# A job's path fits a preload's `/upstream/<model>/` for the longest model
# name (queueapp/job_body.py MAX_JOB_PATH); the name is stored unencoded.
# Widening a varchar changes PostgreSQL's catalog only: no table rewrite.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('queueapp', '0025_preload'),
    ]

    operations = [
        migrations.AlterField(
            model_name='job',
            name='path',
            field=models.CharField(max_length=211),
        ),
        migrations.AlterField(
            model_name='runstats',
            name='path',
            field=models.CharField(max_length=211),
        ),
    ]
