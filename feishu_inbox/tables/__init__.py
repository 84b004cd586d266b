"""Tables beside ``models.py`` (which is at the module line limit), each a leaf that imports
only Django: ``flow`` (rate buckets, concurrency slots, pauses: SPEC §9c), ``batches``
(workflows' batches and their members' events: SPEC §9f), ``webhooks`` (outbound
webhooks' endpoints, messages and attempts: SPEC §9h), ``turns`` (a turn's cleanups
waiting for its job to end: SPEC §9g), ``tenants`` (a store app's ticket and tokens:
SPEC §9j) and ``backfills`` (backfills and exports: SPEC §9i). ``models.py`` imports
them, so Django finds them as the app's models; their names are also importable from there."""
