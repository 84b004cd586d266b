"""The operator's actions in admin: one table, each action behind its own permission.

An action runs on the jobs selected in the list, or on the one job whose page shows its button
(only the buttons its state and the user's permissions allow). Those that assert something
about the outside world, or stop or re-run work, go through a confirmation page first (Django's
two-step ``delete_selected`` pattern). Each job an action moves is written to the admin
history; each it refuses is named with its code and reason, and stays as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import ngettext

from ..ledger import rules as ledger
from ..ledger import waits
from ..models import EventJob, Status, Step

if TYPE_CHECKING:
    from .jobs import EventJobAdmin


@dataclass(frozen=True)
class JobAction:
    name: str
    #: In the actions menu, on the confirmation page and in the admin history.
    label: str
    #: On a job's own page.
    button: str
    call: Callable[[list[int], str | None], ledger.Outcome]
    #: ``feishu_inbox.<permission>_eventjob``, unless ``codename`` names another.
    permission: str
    confirm: bool
    eligible: tuple[Status, ...]
    #: It may run a job again from one of its steps (SPEC §7): the confirmation page offers
    #: the jobs' step names, and it is shown whenever a selected job has steps.
    from_step: bool = False
    #: The permission's codename, when it is not ``<permission>_eventjob``.
    codename: str = ""

    @property
    def perm(self) -> str:
        return f"feishu_inbox.{self.codename or self.permission + '_eventjob'}"


ACTIONS: dict[str, JobAction] = {
    action.name: action
    for action in (
        JobAction(
            "requeue_failed",
            "Requeue failed jobs (run again from attempt 0)",
            "Requeue",
            lambda ids, step: ledger.requeue(ids, from_step=step),
            "requeue",
            False,
            (Status.FAILED,),
            from_step=True,
        ),
        JobAction(
            "reconcile_not_applied",
            "Reconcile unknown: the effect did NOT happen, run again",
            "Reconcile: not applied, run again",
            lambda ids, step: ledger.reconcile(ids, applied=False, from_step=step),
            "reconcile",
            True,
            (Status.UNKNOWN,),
            from_step=True,
        ),
        JobAction(
            "reconcile_applied",
            "Reconcile unknown: the effect happened, mark done",
            "Reconcile: applied, mark done",
            lambda ids, step: ledger.reconcile(ids, applied=True),
            "reconcile",
            True,
            (Status.UNKNOWN,),
        ),
        JobAction(
            "discard_failed",
            "Discard failed jobs (mark done, unblock the chat)",
            "Discard",
            lambda ids, step: ledger.discard(ids),
            "discard",
            True,
            (Status.FAILED,),
        ),
        JobAction(
            "cancel_jobs",
            "Cancel jobs (waiting ones now, running ones at their next checkpoint)",
            "Cancel",
            lambda ids, step: ledger.cancel(ids),
            "cancel",
            True,
            (Status.QUEUED, Status.RETRY_WAIT, Status.WAITING, Status.RUNNING),
        ),
        JobAction(
            "resume_waiting",
            "Resume waiting jobs now (their wait gets an empty signal; a sleep ends)",
            "Resume now",
            lambda ids, step: waits.resume_jobs(ids),
            "signal",
            True,
            (Status.WAITING,),
            codename="signal_wait",
        ),
        JobAction(
            "time_out_waiting",
            "Time out waiting jobs now (the handler sees its wait time out)",
            "Time out now",
            lambda ids, step: waits.time_out_jobs(ids),
            "signal",
            True,
            (Status.WAITING,),
            codename="signal_wait",
        ),
        JobAction(
            "replay_completed",
            "Replay completed jobs (run the event again, history kept)",
            "Replay",
            lambda ids, step: ledger.replay(ids, from_step=step),
            "replay",
            True,
            (Status.COMPLETED,),
            from_step=True,
        ),
    )
}


def as_admin_action(name: str) -> Callable[..., HttpResponse | None]:
    action = ACTIONS[name]

    def run(
        model_admin: EventJobAdmin, request: HttpRequest, queryset: QuerySet[EventJob]
    ) -> HttpResponse | None:
        return run_action(model_admin, request, queryset, action)

    run.__name__ = name
    return admin.action(description=action.label, permissions=[action.permission])(run)


def allowed(request: HttpRequest, job: EventJob) -> list[JobAction]:
    """The actions this user may take on this job in its present state (its page's buttons)."""
    return [
        action
        for action in ACTIONS.values()
        if job.status in action.eligible and request.user.has_perm(action.perm)
    ]


def run_action(
    model_admin: EventJobAdmin,
    request: HttpRequest,
    queryset: QuerySet[EventJob],
    action: JobAction,
) -> HttpResponse | None:
    jobs = list(queryset.order_by("pk"))
    back = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(back, {request.get_host()}):
        back = ""
    steps = _step_names(jobs) if action.from_step else []
    if (action.confirm or steps) and request.POST.get("confirmed") != "yes":
        return TemplateResponse(
            request,
            "feishu_inbox/confirm_action.html",
            {
                **model_admin.admin_site.each_context(request),
                "title": "Are you sure?",
                "action": action.name,
                "action_label": action.label,
                "jobs": jobs,
                "eligible": " or ".join(action.eligible),
                "ineligible": [j for j in jobs if j.status not in action.eligible],
                "opts": EventJob._meta,
                "action_checkbox_name": ACTION_CHECKBOX_NAME,
                "next": back,
                "steps": steps,
            },
        )
    outcome = action.call([j.pk for j in jobs], request.POST.get("from_step") or None)
    _record(model_admin, request, jobs, outcome, action)
    _report(model_admin, request, outcome, action)
    return HttpResponseRedirect(back) if back else None


def _step_names(jobs: list[EventJob]) -> list[str]:
    """The selected jobs' step names, in the order they started (the from-step choices)."""
    names = (
        Step.objects.filter(job__in=jobs)
        .order_by("started_at", "id")
        .values_list("name", flat=True)
    )
    return list(dict.fromkeys(names))


def _record(
    model_admin: EventJobAdmin,
    request: HttpRequest,
    jobs: list[EventJob],
    outcome: ledger.Outcome,
    action: JobAction,
) -> None:
    """Who did what, to which job, in the admin history (a moved job under its new id)."""
    changed = set(outcome.done) | set(outcome.pending) | set(outcome.moved)
    for job in jobs:
        if job.pk not in changed:
            continue
        note = f"{action.label} (job #{job.pk}, was {job.status})"
        if job.pk in outcome.pending:
            note += ": asked to stop at its next checkpoint"
        if job.pk in outcome.moved:
            note += f": moved to the end of its chat as job #{outcome.moved[job.pk]}"
            job = EventJob.objects.get(pk=outcome.moved[job.pk])
        model_admin.log_change(request, job, note)


def _report(
    model_admin: EventJobAdmin, request: HttpRequest, outcome: ledger.Outcome, action: JobAction
) -> None:
    done = len(outcome.done)
    if done:
        model_admin.message_user(
            request,
            ngettext("%(n)d job: %(label)s.", "%(n)d jobs: %(label)s.", done)
            % {"n": done, "label": action.label},
            messages.SUCCESS,
        )
    for old, new in outcome.moved.items():
        model_admin.message_user(
            request,
            f"Job #{old} is replayed as job #{new}: later jobs of its chat had run, so it "
            "runs again as the chat's newest.",
            messages.INFO,
        )
    if outcome.pending:
        ids = ", ".join(f"#{i}" for i in outcome.pending)
        model_admin.message_user(
            request,
            f"Running, asked to stop at the next checkpoint: {ids}. They end Cancelled "
            "(or unknown, if an effect is uncertain).",
            messages.INFO,
        )
    if outcome.refused:
        reasons = "; ".join(f"#{pk}: {err.described()}" for pk, err in outcome.refused.items())
        model_admin.message_user(
            request,
            ngettext(
                "%(n)d job refused, nothing changed for it: %(reasons)s",
                "%(n)d jobs refused, nothing changed for them: %(reasons)s",
                len(outcome.refused),
            )
            % {"n": len(outcome.refused), "reasons": reasons},
            messages.ERROR if not (outcome.done or outcome.pending) else messages.WARNING,
        )


def page_context(request: HttpRequest, job: EventJob | None) -> dict[str, Any]:
    """What a job's page needs for its buttons."""
    if job is None:
        return {}
    return {
        "job_actions": allowed(request, job),
        "action_checkbox_name": ACTION_CHECKBOX_NAME,
    }
