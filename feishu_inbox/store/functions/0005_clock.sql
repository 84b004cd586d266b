-- feishu_inbox_now_plus(seconds): the database's clock plus that many seconds, so the queries
-- PostgreSQL and SQLite share (common.sql) read one clock expression. SQLite's store registers
-- a function of the same name on each connection. A single-SELECT STABLE SQL function:
-- PostgreSQL inlines it into the calling query.
CREATE OR REPLACE FUNCTION feishu_inbox_now_plus(p_seconds float8) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT now() + p_seconds * interval '1 second'
$$;
