-- Migration 0027 (new function; the others as in 0025, 0024 and before): a worker's batch.
-- * feishu_inbox_finish_batch (new): the finishes a worker gathered over its flush window, of
--   jobs of different partitions, and one claim of up to p_limit next heads (the free places
--   of its slots and of its small local buffer), in one statement and one commit. Unlike
--   feishu_inbox_finish_together (one claim of one job per finish, each with its own token),
--   the claim here is one: one token, one LIMIT, one pass over the claimable index. A worker
--   of the version before never calls it (a rolling deploy is safe).

CREATE OR REPLACE FUNCTION feishu_inbox_finish_batch(
    p_worker text, p_ids bigint[], p_tokens text[], p_keys text[], p_error_types text[],
    p_new_token text, p_limit integer, p_lease float8, p_prefixes text[],
    p_excluding boolean DEFAULT FALSE
) RETURNS TABLE (finished_id bigint, ended_status text, claimed {job})
LANGUAGE plpgsql AS $$
DECLARE
    i integer;
    v_status text[] := array_fill(NULL::text, ARRAY[cardinality(p_ids)]);
BEGIN
    -- Partition rows in key order, then their job rows (the ledger's one lock order), each
    -- finish fenced on its own by feishu_inbox_end_attempt: a lost one ends NULL and changes
    -- nothing, and the others go on.
    FOR i IN SELECT k.n FROM unnest(p_keys) WITH ORDINALITY AS k(key, n) ORDER BY k.key LOOP
        v_status[i] := feishu_inbox_end_attempt(p_ids[i], p_worker, p_tokens[i], p_keys[i],
            FALSE, p_error_types[i], '', 0, 0);
    END LOOP;
    FOR i IN 1 .. cardinality(p_ids) LOOP
        finished_id := p_ids[i];
        ended_status := v_status[i];
        claimed := NULL;
        RETURN NEXT;
    END LOOP;
    -- The claim comes last, in statements of its own (each sees the heads the finishes above
    -- made due), and never waits: it skips rows others hold, but not the ones locked above,
    -- so a finished partition's next job can be claimed in the same commit, never before it.
    IF p_limit > 0 THEN
        finished_id := NULL;
        ended_status := NULL;
        IF p_prefixes IS NULL THEN
            FOR claimed IN
                SELECT * FROM feishu_inbox_claim(p_worker, p_new_token, p_lease, p_limit)
            LOOP
                RETURN NEXT;
            END LOOP;
        ELSE
            FOR claimed IN
                SELECT * FROM feishu_inbox_claim_prefixed(p_worker, p_new_token, p_lease,
                                                         p_limit, p_prefixes, p_excluding)
            LOOP
                RETURN NEXT;
            END LOOP;
        END IF;
    END IF;
END
$$;
