"""The work channel says what happened: `queued` (a job to run), `freed` (a
job left the running state) or `granted` (a job started), so a dispatcher
whose GPU is busy sleeps through a burst of submissions, and through a
front-door job's end that granted the next job in the same commit; it wakes
only when the GPU is left free (queueapp/dispatch/wakeup.py). Other changes
still notify with an empty payload (`work_available`)."""

from importlib import import_module

from django.db import migrations

NOTIFY_FUNCTION = """
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
        -- New work for the dispatcher (a re-queue), the GPU slot freed, or
        -- taken again (a front-door process ends its job and grants the
        -- next in one commit: a waiting dispatcher hears both, in order).
        IF NEW.status = 'queued' THEN
            PERFORM pg_notify('gpusched_work', 'queued');
        ELSIF OLD.status = 'running' THEN
            PERFORM pg_notify('gpusched_work', 'freed');
        ELSIF NEW.status = 'running' THEN
            PERFORM pg_notify('gpusched_work', 'granted');
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

# The function as migration 0012 created it, for going back.
PREVIOUS_FUNCTION = import_module("queueapp.migrations.0012_front_door_gateway").FUNCTION


class Migration(migrations.Migration):
    dependencies = [
        ("queueapp", "0013_jobevent_kind_choices"),
    ]

    operations = [migrations.RunSQL(NOTIFY_FUNCTION, PREVIOUS_FUNCTION)]
