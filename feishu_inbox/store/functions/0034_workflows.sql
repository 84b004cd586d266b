-- Migration 0034 (workflows, SPEC §9f): a member of a batch (a job whose batch_id is set) that
-- moves into an ended state (completed, failed) or out of one writes a batch event in its own
-- transaction, and tells the workers (NOTIFY, delivered at its commit). The workers fold the
-- events into their batches and fire the batches that are done (ledger/workflows.py).
--
-- Why a trigger: a job ends in a dozen places (a worker's finish, alone, grouped or batched;
-- a failure past its attempts; a lease that expired; an operator's cancel, discard,
-- reconcile, requeue or replay), and one that any of them missed would hold its batch for
-- ever. Why an insert and not the batch's count: a worker's batched finish ends the members of
-- several batches in one statement, in the plan's order; two such finishes updating the same
-- batches' rows in opposite orders would deadlock. An insert locks nothing anyone else holds.
-- The WHEN clause keeps it off every other job's update: no event is even queued for them.

CREATE OR REPLACE FUNCTION feishu_inbox_member_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {batch_event} (batch_id, delta)
    VALUES (NEW.batch_id,
            CASE WHEN NEW.status IN ('{completed}', '{failed}') THEN -1 ELSE 1 END);
    PERFORM pg_notify('{channel}', '{batches_notice}');
    RETURN NULL;
END
$$;

CREATE TRIGGER feishu_inbox_member_moved AFTER UPDATE OF status ON {job}
    FOR EACH ROW
    WHEN (NEW.batch_id IS NOT NULL
          AND (OLD.status IN ('{completed}', '{failed}'))
              <> (NEW.status IN ('{completed}', '{failed}')))
    EXECUTE FUNCTION feishu_inbox_member_moved();
