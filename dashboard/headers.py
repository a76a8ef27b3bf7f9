"""Security headers on every response: no page of the dashboard may be framed by another site,
and every HTML page carries a Content-Security-Policy (``app.py`` gives the page's and the API
docs' own; an HTML response without one gets the page's). Added at the outermost layer, so the
refusals of the guards, the static files and ``/docs`` carry them as well."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Anything that is not HTML (JSON, the stream, scripts): nothing may be loaded or framed by it.
OTHER_CSP = b"default-src 'none'; frame-ancestors 'none'"


class SecurityHeaders:
    def __init__(self, app: ASGIApp, html_csp: str) -> None:
        self.app = app
        self.html_csp = html_csp.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {key.lower() for key, _ in headers}
                if b"content-security-policy" not in names:
                    html = any(
                        key.lower() == b"content-type" and value.startswith(b"text/html")
                        for key, value in headers
                    )
                    headers.append(
                        (b"content-security-policy", self.html_csp if html else OTHER_CSP)
                    )
                if b"x-frame-options" not in names:
                    headers.append((b"x-frame-options", b"DENY"))
                if b"x-content-type-options" not in names:
                    headers.append((b"x-content-type-options", b"nosniff"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
