-- Migration 0014: on PostgreSQL the job's and the partition's CHECK constraints become row
-- triggers that check the same conditions and fail the same way (SQLSTATE 23514,
-- check_violation, under the constraint's name: Django raises IntegrityError as before).
--
-- Why: PostgreSQL keeps a CHECK constraint as the text of its expression tree and, for every
-- statement that writes the table, parses that text again, plans it and builds its executor
-- state (ExecRelCheck: stringToNode, expression_planner, ExecPrepareExpr), before checking a
-- single row. The job table's six checks are 6.5 KB of such text; a job writes its row three
-- times and its partition's row two or three times. Measured with the stored functions alone
-- (pgbench, one client, commits not flushed so that only CPU counts): those parses were
-- about a fifth of the backend's CPU per job; with these triggers an enqueue costs 0.78 and
-- a finish with its next claim 0.80 of what they did, within a few percent of no checks at
-- all. A PL/pgSQL trigger compiles once per session, and its conditions are simple
-- expressions whose plans stay cached.
--
-- The conditions are the constraints' (models.py), NULL passing as in a CHECK:
-- * feishu_inbox_job_status_valid: the status is one of the job statuses;
-- * feishu_inbox_job_lease_iff_running: a lease (until, token, worker) exactly while running;
-- * the PositiveIntegerField checks of attempt, effects_in_flight, replays, max_attempts;
-- * feishu_inbox_partition_head_iff_busy: a head exactly when the partition is not idle.
-- SQLite keeps the CHECK constraints: it compiles them into each prepared statement.
-- tests/test_row_checks.py holds every condition on both databases.

-- The ledger's lock order (partition row, then job row), taken for the whole migration: run
-- while workers and the webhook write, it can then wait for them but never deadlock with them.
LOCK TABLE {partition}, {job} IN ACCESS EXCLUSIVE MODE;

CREATE OR REPLACE FUNCTION feishu_inbox_job_check() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_failed text;
BEGIN
    IF NOT (NEW.status = ANY (ARRAY['{queued}', '{running}', '{retry_wait}', '{completed}',
                                    '{failed}', '{unknown}'])) THEN
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

CREATE OR REPLACE FUNCTION feishu_inbox_partition_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF ((NEW.head_state = '{idle}') = (NEW.head_id IS NULL)) IS NOT FALSE THEN
        RETURN NEW;  -- NULL passes, as in a CHECK (head_state is NOT NULL anyway)
    END IF;
    RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"',
        TG_TABLE_NAME, 'feishu_inbox_partition_head_iff_busy'
        USING ERRCODE = 'check_violation', CONSTRAINT = 'feishu_inbox_partition_head_iff_busy',
              TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA,
              DETAIL = format('Partition %L: head_state %L, head_id %s.', NEW.key,
                              NEW.head_state, COALESCE(NEW.head_id::text, 'NULL'));
END
$$;

CREATE TRIGGER feishu_inbox_job_check BEFORE INSERT OR UPDATE ON {job}
    FOR EACH ROW EXECUTE FUNCTION feishu_inbox_job_check();
CREATE TRIGGER feishu_inbox_partition_check BEFORE INSERT OR UPDATE ON {partition}
    FOR EACH ROW EXECUTE FUNCTION feishu_inbox_partition_check();

ALTER TABLE {job}
    DROP CONSTRAINT feishu_inbox_job_status_valid,
    DROP CONSTRAINT feishu_inbox_job_lease_iff_running,
    DROP CONSTRAINT {job}_attempt_check,
    DROP CONSTRAINT {job}_effects_in_flight_check,
    DROP CONSTRAINT {job}_replays_check,
    DROP CONSTRAINT {job}_max_attempts_check;
ALTER TABLE {partition} DROP CONSTRAINT feishu_inbox_partition_head_iff_busy;
