-- Migration 0030 (waits, SPEC §9e): the job's row check lets a job be `waiting` (it holds no
-- lease, as every state but running). The rest of the trigger is 0014_row_checks.sql's.

CREATE OR REPLACE FUNCTION feishu_inbox_job_check() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_failed text;
BEGIN
    IF NOT (NEW.status = ANY (ARRAY['{queued}', '{running}', '{retry_wait}', '{completed}',
                                    '{failed}', '{unknown}', '{waiting}'])) THEN
        v_failed := 'feishu_inbox_job_status_valid';
    ELSIF NOT (CASE WHEN NEW.status = '{running}'
                    THEN NEW.lease_until IS NOT NULL AND NEW.lease_token <> ''
                         AND NEW.worker_id <> ''
                    ELSE NEW.lease_until IS NULL AND NEW.lease_token = '' END) THEN
        v_failed := 'feishu_inbox_job_lease_iff_running';
    ELSIF NEW.attempt < 0 THEN
        v_failed := '{job}_attempt_check';
    ELSIF NEW.effects_in_flight < 0 THEN
        v_failed := '{job}_effects_in_flight_check';
    ELSIF NEW.replays < 0 THEN
        v_failed := '{job}_replays_check';
    ELSIF NEW.max_attempts < 0 THEN
        v_failed := '{job}_max_attempts_check';
    ELSE
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"',
        TG_TABLE_NAME, v_failed
        USING ERRCODE = 'check_violation', CONSTRAINT = v_failed, TABLE = TG_TABLE_NAME,
              SCHEMA = TG_TABLE_SCHEMA,
              DETAIL = format('Job %s: status %L, lease_until %s, lease_token %L, '
                              'worker_id %L, attempt %s.', NEW.id, NEW.status,
                              COALESCE(NEW.lease_until::text, 'NULL'), NEW.lease_token,
                              NEW.worker_id, NEW.attempt);
END
$$;
