-- Migration 0039's reverse: feishu_inbox_claim_fair dropped, and feishu_inbox_enqueue dropped
-- so that 0037_tenants.sql (run after this file, with 0015, 0028, 0029 and 0033) creates it
-- again as it was; the others are replaced by those files' definitions.

DROP FUNCTION IF EXISTS feishu_inbox_claim_fair(text, text, float8, integer, text[], boolean);
DROP FUNCTION IF EXISTS feishu_inbox_enqueue(
    text, text, text, text, text, boolean, jsonb, integer, text, text);
