"""Front-door gateways: the web process that waits for a job, and the
notifications that wake a waiting caller and the dispatcher.

The trigger covers every path that changes a job's status (services, the
claim, recovery, the admin, raw SQL), so no writer can forget to notify.
NOTIFY is delivered at commit and never for a rolled-back change; identical
notifications of one transaction are delivered once.
"""

from django.db import migrations, models

# The function alone: the next migration that replaces it goes back to it.
FUNCTION = """
CREATE OR REPLACE FUNCTION queueapp_job_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.status = 'queued' THEN
            PERFORM pg_notify('gpusched_work', '');
        END IF;
        RETURN NULL;
    END IF;
    IF NEW.status IS DISTINCT FROM OLD.status THEN
        -- New work for the dispatcher (a re-queue), or the GPU slot freed.
        IF NEW.status = 'queued' OR OLD.status = 'running' THEN
            PERFORM pg_notify('gpusched_work', '');
        END IF;
        -- The waiting caller's process: granted (with what it needs to use
        -- the grant: claim token, lease length and expiry, score), cancelled
        -- or failed before it ran. Fields are separated by spaces.
        IF NEW.gateway IS NOT NULL AND OLD.status = 'queued' THEN
            PERFORM pg_notify(
                'gpusched_gateway_' || NEW.gateway,
                concat_ws(' ', NEW.id, NEW.status, coalesce(nullif(NEW.lease_owner, ''), '-'),
                          coalesce(extract(epoch FROM NEW.lease_expires_at - NEW.started_at), 0),
                          coalesce(extract(epoch FROM NEW.lease_expires_at), 0),
                          coalesce(NEW.score_at_dispatch ->> 'effective', '-'))
            );
        END IF;
    END IF;
    RETURN NULL;
END
$$;
"""

NOTIFY_FUNCTION = (
    FUNCTION
    + """CREATE TRIGGER queueapp_job_notify
    AFTER INSERT OR UPDATE OF status ON queueapp_job
    FOR EACH ROW EXECUTE FUNCTION queueapp_job_notify();
-- One number per web process start; the advisory lock it holds under that
-- number is its liveness (queueapp/frontdoor/gateway.py).
CREATE SEQUENCE queueapp_gateway_seq AS integer CYCLE;
"""
)

DROP = """
DROP TRIGGER IF EXISTS queueapp_job_notify ON queueapp_job;
DROP FUNCTION IF EXISTS queueapp_job_notify();
DROP SEQUENCE IF EXISTS queueapp_gateway_seq;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("queueapp", "0011_tier_max_running_jobs_at_least_one"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="gateway",
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                "gateway",
                condition=models.Q(("front_door", True), ("status", "queued")),
                name="job_queued_gateway",
            ),
        ),
        migrations.RunSQL(NOTIFY_FUNCTION, DROP),
    ]
