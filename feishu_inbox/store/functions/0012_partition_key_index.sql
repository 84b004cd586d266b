-- Migration 0012: drop the varchar_pattern_ops index Django adds beside the primary key of a
-- CharField (feishu_inbox_partition_key_…_like). No query reads it: partition rows are only
-- ever found by key equality (the primary key) or by head state (the partial indexes), and
-- the admin's prefix search reads the job table's own index. Every claim and every finish
-- rewrote the partition row without HOT (head_state is in the partial indexes), so each paid
-- an insert into this index too.
DO $$
DECLARE
    v_index text;
BEGIN
    FOR v_index IN
        SELECT indexname FROM pg_indexes
        WHERE schemaname = current_schema() AND tablename = '{partition}'
          AND indexdef LIKE '%varchar_pattern_ops%'
    LOOP
        EXECUTE format('DROP INDEX %I', v_index);
    END LOOP;
END
$$;
