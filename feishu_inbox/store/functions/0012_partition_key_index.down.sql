-- Undo 0012_partition_key_index.sql: the index as Django named it.
CREATE INDEX IF NOT EXISTS feishu_inbox_partition_key_8fcb5803_like
    ON {partition} (key varchar_pattern_ops);
