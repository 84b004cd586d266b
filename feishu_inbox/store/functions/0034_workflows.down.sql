-- Undo 0034_workflows.sql: no batch member trigger.

DROP TRIGGER IF EXISTS feishu_inbox_member_moved ON {job};
DROP FUNCTION IF EXISTS feishu_inbox_member_moved();
