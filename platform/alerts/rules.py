"""Evaluating the projects' metric rules over their running runs (the ``alerts.evaluate_rules`` beat
task, every ``ALERT_RULES_INTERVAL_S``).

Off the ingestion path on purpose: storing metrics stays one statement, whatever rules exist. A pass
reads, per (rule, run), only the points stored since its last pass (``RuleState.checked_step``, a range
of the (run, key, step) index) or one indexed ``max(step)``; a rule's alert therefore opens within one
interval of its condition becoming true.

- ``no_improvement``: the metric's best value (max or min by ``goal``; the first step that reached it)
  is at least ``steps`` steps older than its latest point.
- ``missing``: the run has stored metrics ``steps`` steps past the metric's last point (or the metric
  never came). The ingestion refuses non-finite values and the engine's sink drops them, so this is
  how a NaN/inf loss shows.

A condition found true opens the rule's alert (or repeats the open one); found false, it resolves the
open one. An alert a person resolved is not reopened while nothing changed (same best step, same last
point), only when the condition holds anew.

Bounded: one pass at a time over all workers (a lock in the cache, Redis when configured: a pass that
finds another running skips); a rule reads at most ``ALERT_RULE_POINTS_PER_PASS`` points of a run per
pass (a new or changed rule catches up over several passes, deciding nothing until it has), and a
project has at most ``ALERT_RULES_PER_PROJECT`` rules.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Max

from accounts.throttles import STORE_ERRORS
from alerts.models import Alert, AlertKind, Goal, MetricRule, RuleKind, RuleState
from alerts.services import alert_key, alert_raise, alert_resolve
from experiments.models import Run, RunState
from tracking.models import MetricPoint, RunProgress

log = logging.getLogger(__name__)

READ_CHUNK = 2000
PASS_LOCK = "alerts:rules-pass"
PASS_LOCK_TTL_S = 300  # renewed after every evaluation: a pass whose worker died frees it by then


@dataclass(frozen=True)
class Finding:
    holds: bool
    fingerprint: int | None = None  # what must change before a resolved alert reopens
    message: str = ""
    detail: dict[str, Any] | None = None
    complete: bool = True  # False: the run's points were not all read yet (nothing decided this pass)


def _points_per_pass() -> int:
    return max(1, int(getattr(settings, "ALERT_RULE_POINTS_PER_PASS", 20000)))


def _no_improvement(rule: MetricRule, run_id: int) -> Finding:
    state, _ = RuleState.objects.get_or_create(rule=rule, run_id=run_id)
    best, best_step, last = state.best_value, state.best_step, state.checked_step
    better = (lambda v, b: v > b) if rule.goal == Goal.MAX else (lambda v, b: v < b)
    budget = _points_per_pass()
    new = (
        MetricPoint.objects.filter(run_id=run_id, key=rule.metric, step__gt=state.checked_step)
        .order_by("step")
        .values_list("step", "value")[:budget]
    )
    read = 0
    for step, value in new.iterator(chunk_size=READ_CHUNK):
        read += 1
        if best is None or better(value, best):
            best, best_step = value, step
        last = step
    if last != state.checked_step:
        RuleState.objects.filter(pk=state.pk).update(checked_step=last, best_value=best, best_step=best_step)
    if read >= budget:
        return Finding(False, complete=False)  # more to read: the next pass goes on from ``last``
    if best is None or best_step is None:
        return Finding(False)
    stale = last - best_step
    detail = {"metric": rule.metric, "goal": rule.goal, "best_value": best, "best_step": best_step,
              "last_step": last, "steps": rule.steps}  # fmt: skip
    message = (
        f"{rule.metric} has not improved for {stale} steps (best {best:.6g} at step {best_step}, "
        f"goal {rule.goal}, rule: {rule.steps} steps)"
    )
    return Finding(stale >= rule.steps, best_step, message, detail)


def _missing(rule: MetricRule, run_id: int) -> Finding:
    run_step = RunProgress.objects.filter(run_id=run_id).values_list("step", flat=True).first()
    if run_step is None:
        return Finding(False)
    last = MetricPoint.objects.filter(run_id=run_id, key=rule.metric).aggregate(m=Max("step"))["m"]
    gap = run_step - (last if last is not None else -1)
    since = f"since step {last}" if last is not None else "at all"
    message = (
        f"{rule.metric} has had no value {since} while the run reached step {run_step} (rule: {rule.steps} "
        "steps); the engine drops non-finite values (NaN, inf)"
    )
    detail = {"metric": rule.metric, "last_step": last, "run_step": run_step, "steps": rule.steps}
    return Finding(gap >= rule.steps, last if last is not None else -1, message, detail)


FINDERS = {RuleKind.NO_IMPROVEMENT: _no_improvement, RuleKind.MISSING: _missing}


def rule_evaluate(rule: MetricRule, run_id: int) -> Finding:
    """Evaluate one rule on one run and open, repeat or resolve its alert accordingly."""
    with transaction.atomic():
        finding = FINDERS[RuleKind(rule.kind)](rule, run_id)
        if not finding.complete:
            return finding
        key = alert_key(AlertKind.RULE, rule.pk)
        open_alert = Alert.objects.filter(run_id=run_id, key=key, resolved_at=None).first()
        if not finding.holds:
            if open_alert is not None:
                alert_resolve(alert=open_alert, user=None)
            return finding
        if open_alert is None:
            latest = Alert.objects.filter(run_id=run_id, key=key).order_by("-pk").first()
            if latest is not None and latest.detail.get("fingerprint") == finding.fingerprint:
                return finding  # resolved, and nothing has changed since
        detail = {**(finding.detail or {}), "fingerprint": finding.fingerprint}
        alert_raise(run_id=run_id, kind=AlertKind.RULE, message=finding.message, rule=rule, detail=detail)
    return finding


@contextmanager
def pass_lock() -> Iterator[bool]:
    """Take the rule passes' lock for this pass if no other pass holds it; yields whether it did. A
    cache that is away counts as held elsewhere (the pass is skipped; the next one runs)."""
    token = uuid.uuid4().hex
    try:
        held = bool(cache.add(PASS_LOCK, token, timeout=PASS_LOCK_TTL_S))
    except STORE_ERRORS:
        log.warning("rule pass skipped: its lock's store is unavailable", exc_info=True)
        held = False
    try:
        yield held
    finally:
        if held:
            try:
                if cache.get(PASS_LOCK) == token:
                    cache.delete(PASS_LOCK)
            except STORE_ERRORS:
                log.warning("rule pass lock not released (it expires in %s s)", PASS_LOCK_TTL_S)


def _renew_lock() -> None:
    with suppress(STORE_ERRORS):
        cache.touch(PASS_LOCK, PASS_LOCK_TTL_S)


def rules_evaluate() -> int | None:
    """Evaluate every active rule on every running run of its project; the number of evaluations, or
    None when another pass was running (this one skipped)."""
    with pass_lock() as held:
        if not held:
            log.info("rule pass skipped: another pass is running")
            return None
        return _evaluate_all()


def _evaluate_all() -> int:
    rules = list(MetricRule.objects.filter(active=True))
    if not rules:
        return 0
    projects = {r.project_id for r in rules}
    runs: dict[int, list[int]] = {}
    for run_id, project_id in Run.objects.filter(state=RunState.RUNNING, project_id__in=projects).values_list(
        "pk", "project_id"
    ):
        runs.setdefault(project_id, []).append(run_id)
    n = 0
    for rule in rules:
        for run_id in runs.get(rule.project_id, []):
            rule_evaluate(rule, run_id)
            n += 1
            _renew_lock()
    return n
