"""HTTP calls to an SGLang server (real or simulated) that are not generation: health, info.

Every call carries the API key when one is set (SGLang leaves /health and /metrics open, but
sending the header there is harmless and keeps one code path).
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx


class ServerAnswerError(ValueError):
    """A server answered something we cannot use; the message says what and where."""


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One verifying TLS context for every client: httpx builds a fresh one per client
    otherwise, and loading the CA bundle costs ~25 ms of CPU — per /metrics poll."""
    return ssl.create_default_context()


def is_healthy(url: str, api_key: str | None, timeout_s: float = 5.0) -> bool:
    try:
        resp = httpx.get(f"{url}/health", headers=auth_headers(api_key), timeout=timeout_s,
                         verify=tls_context())
    except httpx.HTTPError:
        return False
    return resp.status_code == 200


def get_server_info(url: str, api_key: str | None, timeout_s: float = 10.0) -> dict[str, Any]:
    """`/server_info`, falling back to the older `/get_server_info`."""
    headers = auth_headers(api_key)
    last: httpx.Response | None = None
    for path in ("/server_info", "/get_server_info"):
        resp = httpx.get(f"{url}{path}", headers=headers, timeout=timeout_s,
                         verify=tls_context())
        if resp.status_code == 401:
            raise ServerAnswerError(
                f"{url}{path}: 401 Unauthorized; set api_key to the server's --api-key")
        if resp.status_code == 200:
            try:
                body = resp.json()
            except ValueError as exc:
                raise ServerAnswerError(f"{url}{path}: body is not JSON: {exc}") from exc
            if not isinstance(body, dict):
                raise ServerAnswerError(f"{url}{path}: expected a JSON object")
            return body
        last = resp
    status = last.status_code if last is not None else "no answer"
    raise ServerAnswerError(f"{url}: /server_info and /get_server_info answered {status}")


def get_metrics_text(url: str, api_key: str | None, timeout_s: float = 5.0) -> str | None:
    """Prometheus text from /metrics, or None when metrics are not enabled."""
    try:
        resp = httpx.get(f"{url}/metrics", headers=auth_headers(api_key), timeout=timeout_s,
                         verify=tls_context())
    except httpx.HTTPError:
        return None
    return resp.text if resp.status_code == 200 else None
