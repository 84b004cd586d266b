"""The commands (``commands``: ``runworker``, ``inbox``, ``feishu_connect``) and what they
share: ``demo_data`` (``inbox demo-data``'s events in every state).
"""
