"""HTTP load for `manage.py bench api`: keep-alive GETs from worker processes, standard library only.

Kept free of Django so that spawned worker processes import nothing else.
"""

from __future__ import annotations

import http.client
import time


def hammer(host: str, port: int, paths: list[str], headers: dict[str, str], seconds: float) -> dict:
    """GET `paths` round-robin over one keep-alive connection for `seconds`; latencies in ms and errors."""
    connection = http.client.HTTPConnection(host, port, timeout=30)
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < deadline:
        path = paths[i % len(paths)]
        i += 1
        started = time.perf_counter()
        try:
            connection.request("GET", path, headers=headers)
            response = connection.getresponse()
            response.read()
            ok = response.status == 200
        except (OSError, http.client.HTTPException):
            ok = False
            connection.close()
            connection = http.client.HTTPConnection(host, port, timeout=30)
        if ok:
            latencies.append((time.perf_counter() - started) * 1000)
        else:
            errors += 1
    connection.close()
    return {"latencies": latencies, "errors": errors}
