-- Undo 0005_clock.sql.
DROP FUNCTION IF EXISTS feishu_inbox_now_plus(float8);
