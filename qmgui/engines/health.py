"""One bounded look at an engine's health endpoint.

llama-server answers `GET /health` with 503 while it loads and 200 when ready; vLLM's `/health`
is 200 once serving; custom kinds name their own path. Nothing listening is `DOWN`.
"""

from __future__ import annotations

import enum

HEALTH_TIMEOUT_S = 0.5


class Health(str, enum.Enum):
    READY = "ready"  # 2xx
    LOADING = "loading"  # 503 (llama-server while it loads)
    DOWN = "down"  # nothing answers yet
    ERROR = "error"  # answered with another status


def check_health(
    host: str, port: int, path: str = "/health", *, timeout_s: float = HEALTH_TIMEOUT_S
) -> Health:
    """GET `path` once; never raises."""
    import http.client  # noqa: PLC0415 - at the first check: not on the window's start path

    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        resp = conn.getresponse()
        resp.read()
        status = resp.status
    except (OSError, http.client.HTTPException):
        return Health.DOWN
    finally:
        conn.close()
    if 200 <= status < 300:
        return Health.READY
    if status == 503:
        return Health.LOADING
    return Health.ERROR
