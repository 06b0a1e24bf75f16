"""GET /api/v1/settings: the service's limits and policies in force (``serve`` options), for admins."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from bubblescope import wire
from bubblescope.backend.settings import settings_of
from bubblescope.backend.settings_view.service import settings_shown

router = APIRouter(prefix=wire.API_PREFIX, tags=["meta"])


@router.get(
    "/settings",
    response_model=dict[str, Any],
    summary="The settings in force: every serve option by its field name (webhook URLs and passwords hidden)",
)
def get_settings(request: Request) -> dict[str, Any]:
    return settings_shown(settings_of(request))
