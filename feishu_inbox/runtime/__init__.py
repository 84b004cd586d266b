"""The runtime: what runs stored work.

- ``worker``: the worker process (slots, leases renewed in the background, wake-ups, shutdown);
- ``finishing``: finishes that end together written together (group commit);
- ``writes``: a job's ledger writes, tried again through a database blink while its lease lasts;
- ``registry``: the handlers and job kinds registered, and their retry policies;
- ``context``: the running job as the handler API sees it (``Event``, ``JobContext``);
- ``handlers``: the handler API (``effect``, ``checkpoint``); ``steps``: memoized steps.

It reads and writes the ledger only through ``feishu_inbox.ledger``; what the layers above it
offer (schedules, the Feishu SDK, task queues) the ``runworker`` command hands to the worker.
"""
