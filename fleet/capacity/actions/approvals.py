"""Separation of duties for capacity: who may approve what, and how an approval is recorded.

The rules (issue 23, item 7), used by the API, the pages and the admin alike:

1. **Reservations** are approved by someone with ``fleet.change_reservation`` (an Operator or an
   Admin) who did not request them (fleet.capacity.actions.reservations.approve asks ``check_approver``).
2. **Procurement orders and power approvals** are approved or rejected by someone with
   ``fleet.approve_capacity`` (an Admin or a Capacity approver) who did not request them. Anyone
   who may add one creates it *requested*; asking for it to be created already approved is an
   approval by its own requester (rule 4). Only approved orders, and approved or energised power
   approvals, count as supply in the plan.
3. **Team quotas** are created, changed and deleted only with ``fleet.approve_capacity``.
4. **Self-approval**: an Admin may approve what they requested; the row's ``self_approved`` flag
   and the audit entry say so. Nobody else may.
5. Every approval records ``approved_by`` and ``approved_at``, every rejection ``rejected_by`` and
   ``rejected_at`` (each clears the other's: the row says who decided its current state); the
   requester is recorded when the row is created (``requested_by``; a reservation's ``created_by``).
6. A **reservation's fields** are changed only by its requester or an Admin (recorded as such),
   whatever its state (``check_editor``): an approver who could rewrite someone else's request
   could then approve what nobody else asked for, and anyone could reorder an approved one. Once
   approved, a change of what it asks for sends it back to requested, to be approved again
   (fleet.capacity.actions.reservations.update_reservation); its note changes without that.
7. Once approved, what makes the supply is fixed: an order's pool and count, a power approval's
   site and kW. Its date may move later (a slip), never earlier: more supply, or supply sooner,
   is a new request.

A refusal by these rules is ``ApprovalRefused`` (HTTP 403, naming the rule); a refusal by the
row's state is ``ConflictError`` (HTTP 409).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models, transaction
from django.utils import timezone

from console import roles
from console.signals import row_changed
from fleet.capacity.models import ApprovalStatus, OrderApproval, OrderStatus, PowerApproval, ProcurementOrder

APPROVE_CAPACITY = roles.APPROVE_CAPACITY
APPROVE_RESERVATION = "fleet.change_reservation"
CHANGE_QUOTA = APPROVE_CAPACITY

# The rules' names, as a refusal reports them (``rule`` in the 403 body).
RULE_APPROVER_ROLE = "approver-role"
RULE_SEPARATION = "separation-of-duties"
RULE_QUOTA = "quota-approver"

# Power approval states that count as supply: moving into one from another is an approval.
POWER_APPROVED = (ApprovalStatus.APPROVED, ApprovalStatus.ENERGISED)

# The fields an approval or a rejection sets (with the state), as _decide records them.
DECISION_FIELDS = ("approved_by", "approved_at", "self_approved", "rejected_by", "rejected_at")

# Once approved: fields fixed, and dates that may only move later.
FIXED_ONCE_APPROVED = {ProcurementOrder: ("pool", "count"), PowerApproval: ("site", "added_kw")}
LATER_ONLY_ONCE_APPROVED = {ProcurementOrder: "promised_on", PowerApproval: "expected_on"}


class ConflictError(Exception):
    """A state change refused by the current state (HTTP 409). ``detail`` is the response body."""

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.detail = {"detail": message, **detail}


class ApprovalRefused(Exception):
    """Refused by a separation-of-duties rule (HTTP 403). ``detail`` is the response body."""

    def __init__(self, message: str, *, rule: str, field: str | None = None) -> None:
        super().__init__(message)
        self.rule = rule
        self.detail: dict[str, Any] = {"detail": message, "rule": rule}
        if field:
            self.detail[field] = message


def _person(actor: Any) -> Any:
    """The acting person, or None for an agent token or an anonymous caller."""
    return actor if getattr(actor, "pk", None) and getattr(actor, "is_active", False) else None


def _what(model: type[models.Model]) -> str:
    return {ProcurementOrder: "procurement order", PowerApproval: "power approval"}.get(model, "reservation")


def check_approver(actor: Any, *, requester_id: int | None, permission: str, what: str) -> bool:
    """Raise ApprovalRefused unless ``actor`` may approve a ``what`` requested by ``requester_id``;
    return whether it is a self-approval (an Admin approving their own: allowed, recorded)."""
    person = _person(actor)
    if person is None or not person.has_perm(permission):
        who = "an Operator or an Admin" if permission == APPROVE_RESERVATION else "an Admin or a Capacity approver"
        raise ApprovalRefused(f"Approving a {what} needs {who}.", rule=RULE_APPROVER_ROLE)
    if requester_id is None or requester_id != person.pk:
        return False
    if roles.is_admin(person):
        return True
    raise ApprovalRefused(
        f"You requested this {what}: someone else must approve it (separation of duties; only an "
        "Admin may approve their own, and it is recorded as self-approved).",
        rule=RULE_SEPARATION,
    )


def check_editor(actor: Any, *, requester_id: int | None) -> bool:
    """Raise ApprovalRefused unless ``actor`` may change a reservation's fields, in any state
    (rule 6): its requester, or an Admin; return whether it is an Admin changing someone else's
    (recorded)."""
    person = _person(actor)
    if person is not None and requester_id is not None and person.pk == requester_id:
        return False
    if roles.is_admin(person):
        return True
    raise ApprovalRefused(
        "Only its requester or an Admin may change a reservation (separation of duties: whoever approves it "
        "must approve what its requester asked for, and an approval holds for what was approved). Ask them, "
        "or request anew.",
        rule=RULE_SEPARATION,
    )


def check_quota_change(actor: Any) -> None:
    """Raise ApprovalRefused unless ``actor`` may create, change or delete team quotas."""
    person = _person(actor)
    if person is None or not person.has_perm(CHANGE_QUOTA):
        raise ApprovalRefused(
            "Changing a team quota needs an Admin or a Capacity approver (separation of duties).", rule=RULE_QUOTA
        )


def may_change_quota(user: Any) -> bool:
    person = _person(user)
    return person is not None and person.has_perm(CHANGE_QUOTA)


def may_approve_capacity(user: Any) -> bool:
    person = _person(user)
    return person is not None and person.has_perm(APPROVE_CAPACITY)


def approval_message(verb: str, *, self_approved: bool) -> str:
    return f"{verb} (self-approved by an Admin, its own requester)." if self_approved else f"{verb}."


def refused_changes(instance: models.Model, changes: dict[str, Any]) -> dict[str, str]:
    """Rule 7: the fields of ``changes`` an approved order or power approval may not take, with
    why ({} when none)."""
    if not is_approved(instance):
        return {}
    what = _what(type(instance))
    refused = {}
    for name in FIXED_ONCE_APPROVED[type(instance)]:
        if name in changes and changes[name] != getattr(instance, name):
            refused[name] = f"Cannot change once the {what} is approved; request a new one."
    date_field = LATER_ONLY_ONCE_APPROVED[type(instance)]
    new = changes.get(date_field)
    if new is not None and new < getattr(instance, date_field):
        refused[date_field] = f"Once the {what} is approved it may move later, not earlier; request a new one."
    return refused


def is_approved(instance: models.Model) -> bool:
    if isinstance(instance, ProcurementOrder):
        return instance.approval_status == OrderApproval.APPROVED
    if isinstance(instance, PowerApproval):
        return instance.status in POWER_APPROVED
    raise TypeError(instance)


# --- creating (requesting) ------------------------------------------------------------------------


def request_order(*, actor: Any, approve: bool = False, **values: Any) -> ProcurementOrder:
    """Record a procurement order, requested by ``actor``; ``approve``: approved at once by its
    requester, which rule 4 allows an Admin only (ApprovalRefused otherwise, nothing written)."""
    with transaction.atomic():
        order = ProcurementOrder.objects.create(
            requested_by=_person(actor), approval_status=OrderApproval.REQUESTED, **values
        )
        if approve:
            order = approve_order(order, actor=actor)
    return order


def request_power_approval(*, actor: Any, **values: Any) -> PowerApproval:
    """Record a power approval, requested by ``actor``. A status of approved or energised asks for
    it approved at once by its requester: rule 4 (an Admin only; ApprovalRefused, nothing written)."""
    status = values.pop("status", ApprovalStatus.REQUESTED)
    with transaction.atomic():
        approval = PowerApproval.objects.create(requested_by=_person(actor), status=ApprovalStatus.REQUESTED, **values)
        if status in POWER_APPROVED:
            approval = approve_power(approval, actor=actor, status=status)
    return approval


# --- approving and rejecting ---------------------------------------------------------------------


def _decide(
    model: type[ProcurementOrder] | type[PowerApproval],
    pk: int,
    *,
    actor: Any,
    field: str,
    allowed_from: tuple[str, ...],
    to: str,
    approving: bool,
    now: datetime | None,
) -> Any:
    """One approval or rejection: the approver rules, then a conditional UPDATE of ``field`` from a
    state in ``allowed_from`` to ``to`` (409 when the row moved meanwhile or is in another state),
    then the audit entry (console.signals.row_changed)."""
    now = now or timezone.now()
    what = _what(model)
    with transaction.atomic():
        current = model.objects.select_for_update().get(pk=pk)
        # Rejecting is no approval: the requester may withdraw their own (with the permission).
        requester_id = current.requested_by_id if approving else None
        self_approved = check_approver(actor, requester_id=requester_id, permission=APPROVE_CAPACITY, what=what)
        state = getattr(current, field)
        if state not in allowed_from:
            verb = "approved" if approving else "rejected"
            raise ConflictError(f"The {what} is {state}; only a {' or '.join(allowed_from)} one can be {verb}.")
        if isinstance(current, ProcurementOrder) and current.status == OrderStatus.CANCELLED and approving:
            raise ConflictError(f"The {what} is cancelled; it cannot be approved.")
        before = {
            field: state,
            **{name: current._meta.get_field(name).value_from_object(current) for name in DECISION_FIELDS},
        }
        values: dict[str, Any] = {field: to}
        # Whoever decided last is on the row with the state: the approver while approved, the
        # rejecter while rejected (the audit log keeps every decision).
        if approving:
            values.update(
                approved_by=_person(actor),
                approved_at=now,
                self_approved=self_approved,
                rejected_by=None,
                rejected_at=None,
            )
        else:
            values.update(
                approved_by=None, approved_at=None, self_approved=False, rejected_by=_person(actor), rejected_at=now
            )
        moved = model.objects.filter(pk=pk, **{f"{field}__in": allowed_from}).update(**values)
        if moved != 1:
            raise ConflictError(f"The {what} changed meanwhile; reload it.")
        current.refresh_from_db()
        verb = "Approved" if approving else "Rejected"
        message = approval_message(verb, self_approved=self_approved and approving)
        row_changed.send(sender=model, instance=current, before=before, message=message)
    return current


def approve_order(order: ProcurementOrder, *, actor: Any, now: datetime | None = None) -> ProcurementOrder:
    """Approve a requested (or rejected) order: from now on it counts as supply."""
    return _decide(
        ProcurementOrder,
        order.pk,
        actor=actor,
        field="approval_status",
        allowed_from=(OrderApproval.REQUESTED, OrderApproval.REJECTED),
        to=OrderApproval.APPROVED,
        approving=True,
        now=now,
    )


def reject_order(order: ProcurementOrder, *, actor: Any, now: datetime | None = None) -> ProcurementOrder:
    """Reject a requested or approved order: it counts as supply no longer."""
    return _decide(
        ProcurementOrder,
        order.pk,
        actor=actor,
        field="approval_status",
        allowed_from=(OrderApproval.REQUESTED, OrderApproval.APPROVED),
        to=OrderApproval.REJECTED,
        approving=False,
        now=now,
    )


def approve_power(
    approval: PowerApproval, *, actor: Any, status: str = ApprovalStatus.APPROVED, now: datetime | None = None
) -> PowerApproval:
    """Approve a requested (or rejected) power approval, as approved or straight to energised."""
    return _decide(
        PowerApproval,
        approval.pk,
        actor=actor,
        field="status",
        allowed_from=(ApprovalStatus.REQUESTED, ApprovalStatus.REJECTED),
        to=status,
        approving=True,
        now=now,
    )


def reject_power(approval: PowerApproval, *, actor: Any, now: datetime | None = None) -> PowerApproval:
    """Reject a requested, approved or energised power approval: its kW count no longer."""
    return _decide(
        PowerApproval,
        approval.pk,
        actor=actor,
        field="status",
        allowed_from=(ApprovalStatus.REQUESTED, *POWER_APPROVED),
        to=ApprovalStatus.REJECTED,
        approving=False,
        now=now,
    )


def check_status_change(approval: PowerApproval, new_status: str) -> str | None:
    """A power approval's status changed by an edit (PATCH, the admin): only approved -> energised
    (the grid connection went live). Approving and rejecting go through approve_power and
    reject_power. Returns why a change is refused, None when allowed."""
    if new_status == approval.status:
        return None
    if approval.status == ApprovalStatus.APPROVED and new_status == ApprovalStatus.ENERGISED:
        return None
    return (
        "Approve or reject through POST /api/v1/capacity/approvals/{id}/approve/ or /reject/ (separation of "
        "duties); an edit may only move an approved one to energised."
    )
