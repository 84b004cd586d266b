-- Undo 0029_end_attempts_by_key.sql: feishu_inbox_end_attempts plans as 0028 left it.
ALTER FUNCTION feishu_inbox_end_attempts(text, bigint[], text[], text[], text[])
    RESET enable_seqscan;
