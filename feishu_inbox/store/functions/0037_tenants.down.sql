-- Undo 0037_tenants.sql: drop the enqueue that takes p_tenant; the migration then loads
-- 0025_trace_context.sql (the enqueue as it was) again.

DROP FUNCTION IF EXISTS feishu_inbox_enqueue(
    text, text, text, text, text, boolean, jsonb, integer, text, text);
