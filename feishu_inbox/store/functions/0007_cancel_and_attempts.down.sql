-- Undo 0007_cancel_and_attempts.sql (the migration then loads 0002 and 0006 again).
DROP FUNCTION IF EXISTS feishu_inbox_enqueue(text, text, text, text, text, boolean, jsonb, integer);
