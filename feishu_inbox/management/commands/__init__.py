"""The management commands, each thin over a typed layer below:

- ``runworker``: the worker process (``runtime/worker.py``);
- ``inbox``: the operator's ledger from the shell (the admin's ledger functions);
- ``feishu_connect``: the gateway process, a long connection per app (``feishu/gateway.py``).
"""
