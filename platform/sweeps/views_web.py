"""The sweep page: its runs ranked by the metric, a parameter/metric chart; live by polling the API."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from accounts.access import has_role
from accounts.models import Role
from sweeps.selectors import visible_sweeps


@login_required
def sweep_page(request: HttpRequest, pk: int) -> HttpResponse:
    sweep = visible_sweeps(request).select_related("project").filter(pk=pk).first()
    if sweep is None:
        raise Http404("Not found.")
    return render(
        request,
        "web/sweep.html",
        {
            "sweep": sweep,
            "can_write": has_role(request, sweep.project_id, Role.MEMBER),
            "page_data": {
                "sweep_id": sweep.pk,
                "experiment_id": sweep.experiment_id,
                "summary": sweep.summary,
            },
        },
    )
