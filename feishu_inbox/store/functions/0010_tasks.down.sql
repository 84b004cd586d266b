-- Undo 0010_tasks.sql.
DROP FUNCTION IF EXISTS feishu_inbox_claim_prefixed(text, text, float8, integer, text[]);
