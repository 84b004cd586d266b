-- Undo 0028_finish_batch_sets.sql: the batch's finishes' function goes; the migration then
-- loads 0027_finish_batch.sql (feishu_inbox_finish_batch as it was) again.
DROP FUNCTION IF EXISTS feishu_inbox_end_attempts(text, bigint[], text[], text[], text[]);
