-- Migration 0029: feishu_inbox_end_attempts (0028) plans its statements with enable_seqscan
-- off, as the claim has since 0013.
--
-- Why: its plans are generic (0028's plan_cache_mode), planned without the arrays, for ten
-- keys whatever their number. On a partition table of a thousand rows or so whose rows lie in
-- no key order (as a site that receives its chats' first events in turn writes them), the
-- planner costed a sequential scan of every partition below the primary key's index scan,
-- for both the lock of the batch's partitions and the update of their heads: each batch then
-- compared every partition's key with every key of the batch (measured on the 2-core
-- machine, 30,000 no-op jobs at 1 worker x 4 slots in 1,000 chats: perf put about a tenth of
-- PostgreSQL's CPU in those comparisons). Its statements all find their rows by key (the
-- partitions' and the jobs' primary keys, the partial index of unresolved jobs); no plan that
-- reads a whole table is ever the right one for them, small tables included.
ALTER FUNCTION feishu_inbox_end_attempts(text, bigint[], text[], text[], text[])
    SET enable_seqscan = off;
