"""The jobs table's notices become JSON objects, and the trigger's function
moves to one file, queueapp/sql/job_notify.sql, beside its one parser,
queueapp/job_notices.py: a field added to the notice is a key, not a shifted
position, and a test holds the SQL and the parser together.

The file is read as it is when this migration runs: a later change to it
comes with a migration of its own that loads it again, whose reverse is then
the text this one loads (copied there, as 0015's is copied here)."""

from importlib.resources import files

from django.db import migrations

NOTIFY_FUNCTION = files("queueapp").joinpath("sql/job_notify.sql").read_text(encoding="utf-8")

# The function as migration 0015 left it, for going back.
PREVIOUS_FUNCTION = """
CREATE OR REPLACE FUNCTION queueapp_job_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.status = 'queued' THEN
            PERFORM pg_notify('gpusched_work', 'queued');
        END IF;
        RETURN NULL;
    END IF;
    IF NEW.status IS DISTINCT FROM OLD.status THEN
        -- New work for the dispatchers (a re-queue), a GPU slot freed, or
        -- taken again (a front-door process ends its job and grants the
        -- next in one commit: a waiting dispatcher hears both, in order).
        -- `freed` and `granted` name the GPU: only its dispatcher cares.
        IF NEW.status = 'queued' THEN
            PERFORM pg_notify('gpusched_work', 'queued');
        ELSIF OLD.status = 'running' THEN
            PERFORM pg_notify('gpusched_work', concat_ws(' ', 'freed', OLD.gpu_id));
        ELSIF NEW.status = 'running' THEN
            PERFORM pg_notify('gpusched_work', concat_ws(' ', 'granted', NEW.gpu_id));
        END IF;
        -- The waiting caller's process: granted (with what it needs to use
        -- the grant: claim token, lease length and expiry, score, GPU),
        -- cancelled or failed before it ran. Fields are separated by spaces.
        IF NEW.gateway IS NOT NULL AND OLD.status = 'queued' THEN
            PERFORM pg_notify(
                'gpusched_gateway_' || NEW.gateway,
                concat_ws(' ', NEW.id, NEW.status, coalesce(nullif(NEW.lease_owner, ''), '-'),
                          coalesce(extract(epoch FROM NEW.lease_expires_at - NEW.started_at), 0),
                          coalesce(extract(epoch FROM NEW.lease_expires_at), 0),
                          coalesce(NEW.score_at_dispatch ->> 'effective', '-'),
                          coalesce(NEW.gpu_id::text, '-'))
            );
        END IF;
    END IF;
    RETURN NULL;
END
$$;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("queueapp", "0018_running_limit_counts_gpus"),
    ]

    operations = [migrations.RunSQL(NOTIFY_FUNCTION, PREVIOUS_FUNCTION)]
