"""The runtime: what runs stored work, as rooms of the worker.

- ``worker``: the main loop (claim, place, sleep), the side threads started together and
  watched, stop and drain; ``options``: what a worker is asked to do and the ``Services`` the
  layers above hand it; ``state``: what the rooms share (flags, slots, the database's
  reachability, outcomes);
- ``executor``: one job on a slot (its context, its handler, its outcome);
- ``claimer``: every claim and finish written, alone, grouped or batched, the mode chosen once;
  ``finishing`` (grouped finishes) and ``batching`` (the batch and its buffer) serve it;
- ``attempts``: an attempt that ends other than by finishing (fail, defer, hand back);
- ``heartbeat``: renewals, timeouts, cancel and supersede signals;
- ``chores``: the NOTIFY listener, the worker's heartbeat row and the retention purge, the
  schedule ticker; ``pools``: the handler threads, the async loop, the slots;
- ``interrupts``: SIGTERM and SIGINT acted on by a thread; ``writes``: a job's writes tried
  again through a database blink while its lease lasts;
- ``registry``: the handlers registered, their retry policies, timeouts and limits;
- ``context``: the running job as the handler API sees it (``Event``, ``JobContext``);
- ``handlers``: the handler API (``effect``, ``checkpoint``); ``steps``: memoized steps;
  ``waits``: durable waits (``sleep``, ``sleep_until``, ``wait_for``, ``signal``);
  ``limits``: rate limits and concurrency slots taken from inside a job; ``turns``: a
  chat's burst formed into one turn, what a running turn learns (stop, recall, merge), and
  ``cleanups``: ``on_finish``'s cleanups recorded.

It reads and writes the ledger only through ``feishu_inbox.ledger``; what the layers above it
offer (schedules, the Feishu SDK, task queues) the ``runworker`` command hands to the worker.
"""
