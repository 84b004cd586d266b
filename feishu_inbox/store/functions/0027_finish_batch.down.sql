-- Undo 0027: the batch's function goes; nothing else changed.
DROP FUNCTION IF EXISTS feishu_inbox_finish_batch(
    text, bigint[], text[], text[], text[], text, integer, float8, text[], boolean);
