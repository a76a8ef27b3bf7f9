"""What the Chinese chat bots share: HTTP 200 with an error code in the body."""

from __future__ import annotations

import json


def service_error(body: bytes) -> str | None:
    """The error in a DingTalk, WeCom or Feishu answer; None when it is OK (or not JSON)."""
    try:
        answer = json.loads(body or b"{}")
    except ValueError:
        return None  # not JSON: trust the HTTP status
    if not isinstance(answer, dict):
        return None
    for key in ("errcode", "code", "StatusCode"):
        code = answer.get(key)
        if code not in (None, 0):
            msg = answer.get("errmsg") or answer.get("msg") or answer.get("StatusMessage")
            return f"service error {code}: {str(msg)[:200]}"
    return None
