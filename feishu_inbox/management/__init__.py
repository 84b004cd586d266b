"""The commands (``commands``: ``runworker``, ``inbox``, ``feishu_connect``) and what they
share: ``operator`` (an operator's command: JSON output, ``--user``, ``inbox schedules``) and
``demo_data`` (``inbox demo-data``'s events in every state), ``workflow_view`` (a job's
workflow as ``inbox show`` prints it).
"""
