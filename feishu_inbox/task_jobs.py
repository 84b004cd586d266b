"""The exceptions a task's result names when the ledger, not the task, ended its attempt.

``TaskResult.errors[...].exception_class_path`` names one of these (for example
``feishu_inbox.task_jobs.LeaseExpired``, as the README documents), and the tasks framework
imports the class from that path. The path is part of what a site reads back, so these
classes stay in this module whatever else moves; the task job kind is ``tasks/jobs.py``.
"""

from __future__ import annotations


class TaskEnded(Exception):
    """The ledger ended a task's attempt without the task raising (TaskError's class)."""


class LeaseExpired(TaskEnded):
    """The worker stopped renewing its lease (it was killed or paused); run again."""


class WorkerCrashed(TaskEnded):
    """The worker stopped renewing its lease on the last attempt."""


class LeaseExpiredAfterSideEffect(TaskEnded):
    """The worker stopped inside an effect: the job is unknown until an operator reconciles."""


class UncertainEffect(TaskEnded):
    """The task returned with an effect in flight or uncertain."""


class HandedBack(TaskEnded):
    """The worker shut down before the task started an effect; it runs again."""


class UnknownExpired(TaskEnded):
    """The job stayed unknown past UNKNOWN_RETENTION."""
