-- Undo 0025_trace_context.sql: drop the enqueue that takes p_trace_parent; the migration
-- then loads 0022_enqueue_received_at.sql (the enqueue as it was) again.

DROP FUNCTION IF EXISTS feishu_inbox_enqueue(
    text, text, text, text, text, boolean, jsonb, integer, text);
