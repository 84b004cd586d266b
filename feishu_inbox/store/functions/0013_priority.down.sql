-- Undo 0013_priority.sql: drop the finish_together it made; the migration then loads
-- 0012_hot_path.sql (end_attempt, claim, finish_together as they were) and 0010_tasks.sql
-- (claim_prefixed as it was) again.
DROP FUNCTION IF EXISTS feishu_inbox_finish_together(
    text, bigint[], text[], text[], text[], text[], float8, text[]);
