-- Undo 0014: the CHECK constraints back as Django wrote them (models.py), the triggers gone.
-- Adding a CHECK reads the whole table under this lock: workers and the webhook wait for it.
LOCK TABLE {partition}, {job} IN ACCESS EXCLUSIVE MODE;
ALTER TABLE {job}
    ADD CONSTRAINT feishu_inbox_job_status_valid CHECK (status IN ('{queued}', '{running}',
        '{retry_wait}', '{completed}', '{failed}', '{unknown}')),
    ADD CONSTRAINT feishu_inbox_job_lease_iff_running CHECK (
        (lease_until IS NOT NULL AND status = '{running}' AND NOT (lease_token = '')
         AND NOT (worker_id = ''))
        OR (NOT (status = '{running}') AND lease_token = '' AND lease_until IS NULL)),
    ADD CONSTRAINT {job}_attempt_check CHECK (attempt >= 0),
    ADD CONSTRAINT {job}_effects_in_flight_check CHECK (effects_in_flight >= 0),
    ADD CONSTRAINT {job}_replays_check CHECK (replays >= 0),
    ADD CONSTRAINT {job}_max_attempts_check CHECK (max_attempts >= 0);
ALTER TABLE {partition} ADD CONSTRAINT feishu_inbox_partition_head_iff_busy CHECK (
    (head_id IS NULL AND head_state = '{idle}')
    OR (NOT (head_state = '{idle}') AND head_id IS NOT NULL));
DROP TRIGGER IF EXISTS feishu_inbox_job_check ON {job};
DROP TRIGGER IF EXISTS feishu_inbox_partition_check ON {partition};
DROP FUNCTION IF EXISTS feishu_inbox_job_check();
DROP FUNCTION IF EXISTS feishu_inbox_partition_check();
