"""``python -m duetime.healthcheck [PATH]``: exit 0 when this container's Duetime answers 2xx.

For Docker's HEALTHCHECK and compose healthchecks: the slim image has no curl, and the check must
find the port the process was told to listen on (``DUETIME_HTTP_PORT``) without repeating it in
every service. It asks ``/readyz`` by default (databases and brokers reachable), which is what
"healthy" should mean to a ``depends_on: condition: service_healthy``. Standard library only, so
it starts in milliseconds and cannot fail on a setting the process itself would accept.
"""

from __future__ import annotations

import http.client
import os
import sys
from collections.abc import Mapping, Sequence

TIMEOUT_S = 4.0


def target(environ: Mapping[str, str]) -> tuple[str, int]:
    """Where to ask: the configured host (a wildcard address means this machine) and port."""
    host = (environ.get("DUETIME_HTTP_HOST") or "").strip() or "127.0.0.1"
    if host in ("0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    raw_port = (environ.get("DUETIME_HTTP_PORT") or "").strip() or "8080"
    return host, int(raw_port)


def check(host: str, port: int, path: str) -> tuple[bool, str]:
    conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)
    try:
        conn.request("GET", path, headers={"X-Request-Id": "healthcheck"})
        resp = conn.getresponse()
        body = resp.read(500).decode("utf-8", "replace")
        return 200 <= resp.status < 300, f"{resp.status} {body}"
    except (OSError, http.client.HTTPException) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    path = args[0] if args else "/readyz"
    try:
        host, port = target(environ)
    except ValueError:
        print(f"healthcheck: DUETIME_HTTP_PORT={environ.get('DUETIME_HTTP_PORT')!r} is not a port")
        return 2
    ok, detail = check(host, port, path)
    print(f"healthcheck: GET http://{host}:{port}{path}: {detail}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
