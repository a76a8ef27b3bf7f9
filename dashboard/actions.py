"""``POST /api/run/commands?run=R``: a command to a run's ranks from the page or a script.

Only with a token (``rankwatch serve --token``): without one, anyone who can reach the
dashboard could stop the job, so the request is refused (403) and says how to turn it on. The
body is ``{"cmd": "stop" | "checkpoint" | "note", "ranks": [..] (default: every live rank),
"text": "..." (note), "reason": "...", "incident": "<run>#<n>" (pressed on that incident's
card: an open incident of the run)}``; the answer is the command as stored
(``GET /api/run/commands`` lists it with each rank's answer). Every press is in that history,
with ``by`` naming the page and the client's address; refusals are counted.
"""

from __future__ import annotations

import logging
import threading
from typing import Annotated, Any

from fastapi import APIRouter, Body, HTTPException, Request
from rankwatch.aggregator.provider import ActionError, DataProvider

from .jsonenc import StrictJSONResponse

log = logging.getLogger("rankwatch.dashboard")

NO_TOKEN = (
    "commands from the page need a token: start `rankwatch serve --token-file FILE` (or "
    "RANKWATCH_TOKEN); without one, anyone who can reach this dashboard could stop the job"
)
BODY_KEYS = ("cmd", "ranks", "text", "reason", "incident")
MAX_INCIDENT_CHARS = 300
MAX_RANKS = 65_536

actions_api = APIRouter(prefix="/api", tags=["api"])


class CommandCounts:
    """Command requests over HTTP: accepted, refused without a token, refused as bad."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.n = {"accepted": 0, "no_token": 0, "bad": 0}

    def count(self, what: str) -> None:
        with self._lock:
            self.n[what] += 1

    def counters(self) -> dict[str, int]:
        """For /metrics: ``command_requests_accepted``, ``_no_token``, ``_bad``."""
        with self._lock:
            return {f"command_requests_{k}": v for k, v in self.n.items()}


def _refuse(request: Request, what: str, status: int, detail: str) -> HTTPException:
    request.app.state.command_counts.count(what)
    log.warning("rankwatch: command request refused (%s): %s", what, detail)
    return HTTPException(status_code=status, detail=detail)


@actions_api.post(
    "/run/commands",
    summary="Send a run's ranks a command (checkpoint, stop, note); needs serve --token",
)
def post_command(
    request: Request, run: str, body: Annotated[dict[str, Any], Body()]
) -> StrictJSONResponse:
    if not request.app.state.token_set:
        raise _refuse(request, "no_token", 403, NO_TOKEN)
    unknown = sorted(set(body) - set(BODY_KEYS))
    if unknown:
        raise _refuse(request, "bad", 422, f"unknown field(s) {unknown}; known: {BODY_KEYS}")
    kind, ranks = body.get("cmd"), body.get("ranks")
    text, reason = body.get("text", ""), body.get("reason", "")
    incident = body.get("incident", "")
    if not isinstance(kind, str):
        raise _refuse(request, "bad", 422, "'cmd' must be checkpoint, stop or note")
    if ranks is not None and (
        not isinstance(ranks, list)
        or len(ranks) > MAX_RANKS
        or not all(type(r) is int and r >= 0 for r in ranks)
    ):
        raise _refuse(request, "bad", 422, "'ranks' must be a list of rank numbers")
    if not isinstance(text, str) or not isinstance(reason, str) or len(reason) > 500:
        raise _refuse(request, "bad", 422, "'text' and 'reason' must be strings (reason <= 500)")
    if not isinstance(incident, str) or len(incident) > MAX_INCIDENT_CHARS:
        raise _refuse(request, "bad", 422, "'incident' must be an incident id like 'run#1'")
    client = request.client.host if request.client is not None else "?"
    provider: DataProvider = request.app.state.provider
    try:
        command = provider.issue_command(
            run, kind, by=f"page ({client})", ranks=ranks, text=text, reason=reason,
            incident=incident,
        )  # fmt: skip
    except ActionError as exc:
        raise _refuse(request, "bad", 409, str(exc)) from None
    request.app.state.command_counts.count("accepted")
    return StrictJSONResponse(command)
