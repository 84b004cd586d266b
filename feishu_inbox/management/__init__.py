"""The commands (``commands``: ``runworker``, ``inbox``, ``feishu_connect``) and what they
share: ``operator`` (an operator's command: JSON output, ``--user``, ``inbox schedules``),
``webhooks`` (``inbox webhooks``: outbound webhook endpoints from the shell), ``backfills``
(``inbox backfills`` with the deploy gate ``check``, and ``inbox exports``),
``demo_data`` (``inbox demo-data``'s events in every state) and ``workflow_view`` (a job's
workflow as ``inbox show`` prints it).
"""
