"""Fixtures of the notification tests: a fake webhook receiver, Celery in eager mode, a project with two
members and two webhooks, and `sent()` to run what the notifications app enqueued after commit."""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "monitoring"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from notification_helpers import DELIVER_TASK, FAN_OUT_TASK, task_name  # noqa: E402


@dataclass
class Received:
    path: str
    headers: dict
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


@dataclass
class FakeReceiver:
    """A real HTTP server on 127.0.0.1 that records every POST and answers from `script` (then 200)."""

    base: str = ""
    received: list[Received] = field(default_factory=list)
    script: list[int] = field(default_factory=list)

    def url(self, path: str) -> str:
        return f"{self.base}{path}"

    def at(self, path: str) -> list[Received]:
        return [r for r in self.received if r.path == path]


@pytest.fixture
def receiver():
    fake = FakeReceiver()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with lock:
                fake.received.append(Received(self.path, dict(self.headers), body))
                status = fake.script.pop(0) if fake.script else 200
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fake.base = f"http://127.0.0.1:{server.server_address[1]}"
    yield fake
    server.shutdown()
    server.server_close()


@pytest.fixture
def eager(settings):
    """Run tasks in-process (the unit tests' mode; one test runs a real worker on Redis). Exceptions are not
    propagated: Celery's eager apply() re-applies a retry only then, as a worker would (without the countdown)."""
    from core.celery import app

    before = app.conf.task_always_eager, app.conf.task_eager_propagates
    app.conf.task_always_eager, app.conf.task_eager_propagates = True, False
    yield app
    app.conf.task_always_eager, app.conf.task_eager_propagates = before


@pytest.fixture
def team(project, alice, bob, receiver):
    """team-a with alice (admin) and bob (member), a JSON webhook and a Slack-compatible one."""
    from notifications.models import WebhookEndpoint

    json_hook = WebhookEndpoint.objects.create(project=project, name="ops", url=receiver.url("/json"))
    slack_hook = WebhookEndpoint.objects.create(
        project=project, name="slack", url=receiver.url("/slack"), flavour="slack"
    )
    return {"project": project, "users": [alice, bob], "json": json_hook, "slack": slack_hook}


@pytest.fixture
def sent(django_capture_on_commit_callbacks, eager):
    """sent(action) runs `action` and then, as commits would, the notifications app's enqueues (the fan-out,
    then the deliveries it enqueues on its own commit; only those: the other on-commit work, Kubernetes
    provisioning, is not this suite's). Returns the action's result."""

    def ours(callbacks):
        return [c for c in callbacks if task_name(c) in (FAN_OUT_TASK, DELIVER_TASK)]

    def run(action):
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            result = action()
        pending = ours(callbacks)
        while pending:  # the fan-out's own commit enqueues the deliveries
            with django_capture_on_commit_callbacks(execute=False) as callbacks:
                for callback in pending:
                    callback()
            pending = ours(callbacks)
        return result

    return run
