"""The admin's template tags: ``feishu_inbox_admin`` (a date hierarchy a million-row ledger
can afford).
"""
