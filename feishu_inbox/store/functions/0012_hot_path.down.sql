-- Undo 0012_hot_path.sql: drop what it added; the migration then loads
-- 0007_cancel_and_attempts.sql again, which restores the functions it replaced (same
-- signatures).
DROP FUNCTION IF EXISTS feishu_inbox_finish_together(
    text, bigint[], text[], text[], text[], text[], float8);
