-- The jobs table's trigger function (the trigger itself: migration 0012).
-- Its notices are JSON objects; queueapp/job_notices.py is their one parser,
-- and tests/test_job_notices.py holds this file and that parser together.
-- A change here needs a migration that loads this file again
-- (migration 0019 shows how).
CREATE OR REPLACE FUNCTION queueapp_job_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    work_change text;
    work_gpu bigint;
    gateway_notice text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.status = 'queued' THEN
            work_change := 'queued';
        END IF;
    ELSIF NEW.status IS DISTINCT FROM OLD.status THEN
        -- New work for the dispatchers (a re-queue), a GPU slot freed, or
        -- taken again (a front-door process ends its job and grants the
        -- next in one commit: a waiting dispatcher hears both, in order).
        -- `freed` and `granted` name the GPU: only its dispatcher cares.
        -- No job id: the identical notices of one transaction (a burst of
        -- re-queues) reach a listener once.
        IF NEW.status = 'queued' THEN
            work_change := 'queued';
        ELSIF OLD.status = 'running' THEN
            work_change := 'freed';
            work_gpu := OLD.gpu_id;
        ELSIF NEW.status = 'running' THEN
            work_change := 'granted';
            work_gpu := NEW.gpu_id;
        END IF;
        -- The waiting caller's process: granted (with what it needs to use
        -- the grant: claim token, lease length and expiry, score, GPU),
        -- cancelled or failed before it ran.
        IF NEW.gateway IS NOT NULL AND OLD.status = 'queued' THEN
            gateway_notice := json_build_object(
                'job', NEW.id,
                'status', NEW.status,
                'claim_token', nullif(NEW.lease_owner, ''),
                'lease_seconds', extract(epoch FROM NEW.lease_expires_at - NEW.started_at),
                'lease_expires_at', extract(epoch FROM NEW.lease_expires_at),
                'effective_score', NEW.score_at_dispatch -> 'effective',
                'gpu', NEW.gpu_id
            )::text;
        END IF;
    END IF;
    IF work_change IS NOT NULL THEN
        PERFORM pg_notify(
            'gpusched_work',
            json_build_object('change', work_change, 'gpu', work_gpu)::text
        );
    END IF;
    IF gateway_notice IS NOT NULL THEN
        PERFORM pg_notify('gpusched_gateway_' || NEW.gateway, gateway_notice);
    END IF;
    RETURN NULL;
END
$$;
