"""A node's queue carries only node-agent tasks: the agent there has no database (GPUAAS_ROLE=node-agent).

Every message the control plane sends is recorded (Task.apply_async and Celery.send_task patched, nothing
reaches the broker) while the flows that talk to node agents run: MIG reconfigurations on both backends
(with the sweep's re-sends), discovery's inventory requests and the metrics poll with its re-poll. Any
message addressed to a node queue must name a task of capacity.agent.tasks. A static check covers the
call sites these flows might not reach: every apply_async/send_task given queue=node_queue(...) in the
project's code sends a task imported from capacity.agent.tasks.
"""

from __future__ import annotations

import ast
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery
from celery.app.task import Task
from django.conf import settings
from django.utils import timezone
from reconfig_sim import drive, node_row, start_sim

from capacity.agent import tasks as agent_tasks
from capacity.services.discovery import discover_cluster
from monitoring.tasks import poll_metrics_task, repoll_missing_task
from operations import reconfiguration as rc

pytestmark = pytest.mark.django_db

REPO = Path(__file__).resolve().parents[2]
NODE_QUEUE_PREFIX = "node."
AGENT_TASKS = {obj.name for obj in vars(agent_tasks).values() if isinstance(obj, Task)}


@pytest.fixture
def sent(monkeypatch):
    """(task name, queue) of every message sent while the test runs; none reaches the broker."""
    messages: list[tuple[str, str]] = []

    def apply_async(task, args=None, kwargs=None, **options):
        messages.append((task.name, options.get("queue") or ""))

    def send_task(app, name, args=None, kwargs=None, **options):
        messages.append((name, options.get("queue") or ""))

    monkeypatch.setattr(Task, "apply_async", apply_async)
    monkeypatch.setattr(Celery, "send_task", send_task)
    return messages


@pytest.fixture
def sim(tmp_path):
    sim = start_sim(tmp_path, [("gpu-a", "H100-80GB", 2, {0: ["3g.40gb", "3g.40gb"]}, "")])
    yield sim
    sim.server.stop()


def test_the_control_plane_sends_a_node_queue_nothing_but_node_agent_tasks(
    sim, sent, django_capture_on_commit_callbacks
):
    assert AGENT_TASKS == {
        "capacity.agent.tasks.read_node_metrics_task",
        "capacity.agent.tasks.read_node_inventory_task",
        "capacity.agent.tasks.apply_mig_task",
    }
    with django_capture_on_commit_callbacks(execute=True):
        for backend, target in (("operator", {"0": ["7g.80gb"]}), ("agent", {"1": ["2g.20gb"] * 3})):
            reconf = rc.create(node_row("gpu-a"), target, backend=backend, force=True)
            drive(sim, reconf)
            assert reconf.state == "succeeded", reconf.error
        stuck = rc.create(node_row("gpu-a"), {"0": ["3g.40gb", "3g.40gb"]}, force=True)
        for _ in range(5):  # the sweep re-sends a step whose message was lost, whatever the step
            assert rc.sweep(now=timezone.now() + timedelta(hours=1))["requeued"] == 1
            rc.run_step(stuck.pk, stuck.step, token="t")
            stuck.refresh_from_db()
        assert discover_cluster(sim.cluster.pk).run.status == "succeeded"  # the layout changed: inventory asked
        poll_metrics_task()
        repoll_missing_task(int(timezone.now().timestamp()))

    to_nodes = {name for name, queue in sent if queue.startswith(NODE_QUEUE_PREFIX)}
    assert to_nodes <= AGENT_TASKS, f"tasks sent to a node queue that a node agent does not serve: {to_nodes}"
    assert to_nodes == AGENT_TASKS  # every flow above ran: the check is not vacuous
    steps = [queue for name, queue in sent if name == "capacity.tasks.reconfiguration_step_task"]
    assert len(steps) > 10 and set(steps) == {""}  # every step to the default queue (CELERY_TASK_DEFAULT_QUEUE)
    assert not any(str(route.get("queue", "")).startswith(NODE_QUEUE_PREFIX) for route in _routes())


def _routes() -> list[dict]:
    routes = settings.CELERY_TASK_ROUTES
    return list(routes.values()) if isinstance(routes, dict) else []


def _project_modules() -> list[Path]:
    skip = {".venv", "tests", "node_modules", ".git"}
    return [p for p in REPO.rglob("*.py") if not skip & set(p.relative_to(REPO).parts)]


def _agent_imports(tree: ast.Module) -> set[str]:
    """Local names bound to capacity.agent.tasks' tasks (or to the module) in one module."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "capacity.agent.tasks":
            names |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "capacity.agent":
            names |= {alias.asname or alias.name for alias in node.names if alias.name == "tasks"}
    return names


def _receiver(call: ast.Call) -> str:
    func = call.func
    target = func.value if isinstance(func, ast.Attribute) else func
    while isinstance(target, ast.Attribute):
        target = target.value
    return target.id if isinstance(target, ast.Name) else ""


def test_every_send_to_a_node_queue_in_the_code_is_of_a_node_agent_task():
    checked, wrong = 0, []
    for path in _project_modules():
        tree = ast.parse(path.read_text(), str(path))
        agent_names = _agent_imports(tree)
        in_agent = path.relative_to(REPO).parts[:2] == ("capacity", "agent")
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            queue = next((k.value for k in call.keywords if k.arg == "queue"), None)
            if not (isinstance(queue, ast.Call) and getattr(queue.func, "id", "") == "node_queue"):
                continue
            checked += 1
            method = call.func.attr if isinstance(call.func, ast.Attribute) else ""
            if method == "send_task":
                name = call.args[0].value if call.args and isinstance(call.args[0], ast.Constant) else None
                ok = name in AGENT_TASKS
            else:
                ok = method == "apply_async" and (in_agent or _receiver(call) in agent_names)
            if not ok:
                wrong.append(f"{path.relative_to(REPO)}:{call.lineno}")
    assert wrong == [], f"messages to node queues that are not node-agent tasks: {wrong}"
    assert checked >= 3  # monitoring's metrics reads, capacity's inventory reads, the MIG command
