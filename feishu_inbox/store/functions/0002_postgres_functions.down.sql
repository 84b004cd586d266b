-- Undo 0002_postgres_functions.sql.
DROP FUNCTION IF EXISTS feishu_inbox_claim(text, text, float8, integer);
DROP FUNCTION IF EXISTS feishu_inbox_enqueue(text, text, text, text, text, boolean, jsonb);
DROP FUNCTION IF EXISTS feishu_inbox_end_attempt(
    bigint, text, text, text, boolean, text, text, integer, float8);
