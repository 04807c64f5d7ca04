"""The agent backend across the node-agent split: the control plane decides, the node agent runs NVML.

The apply step (a control-plane worker, with the database) signs a MIG command naming the node and
the target layout of each changed GPU, records it on the reconfiguration and sends it to the node's
queue. The node agent (no database) checks the signature against its own key, sets the layouts, reads
the inventory back and sends a signed result to the control plane (capacity/agent/node.py apply_mig).
`record_result` checks the result's signature and node, writes its read-back inventory (the verify
step's rediscovery) and stores it; the waiting apply step reads it on its next pass and advances.

Idempotency: a command's id is r<reconfiguration>-<attempt>; only the result of the command on record
is stored, once. A lost command or result is recovered by the apply step itself, which sends the same
command again when no result came within MIG_AGENT_RESEND_S (the agent's apply is re-entrant: a second
delivery finds the layout in place and changes nothing); a lost step message by the engine's sweep.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from capacity.adapters import kubernetes as kube
from capacity.agent import protocol
from capacity.agent.tasks import apply_mig_task
from capacity.choices import ReconfigurationEvent as Event
from capacity.choices import ReconfigurationStep as Step
from capacity.models import MigReconfiguration
from capacity.services.inventory import ingest_inventory_reports
from capacity.tasks import enqueue_inventory
from core.celery import node_queue

from .records import audit

logger = logging.getLogger(__name__)


def resend_s() -> int:
    """A command with no result after this long is sent again (the agent or its result was lost)."""
    return settings.MIG_AGENT_RESEND_S


def command_id(reconf: MigReconfiguration) -> str:
    return f"r{reconf.pk}-{reconf.attempts}"


def build_command(reconf: MigReconfiguration) -> dict:
    """The signed command: each changed GPU's target (MIG mode and placements) from the plan."""
    gpus = {
        str(i): {"mig": reconf.plan["gpus"][str(i)]["mig"], "placements": reconf.plan["gpus"][str(i)]["placements"]}
        for i in reconf.plan["changed"]
    }
    body = {"id": command_id(reconf), "product": reconf.plan["product"], "gpus": gpus}
    return protocol.sign(protocol.KIND_MIG_COMMAND, reconf.cluster.name, reconf.node.name, int(time.time()), body)


def result_of(reconf: MigReconfiguration) -> dict | None:
    """The stored result body of this attempt's command, None while there is none."""
    result = reconf.agent_result or {}
    body = result.get("body") or {}
    return body if body.get("id") == command_id(reconf) else None


def send_if_due(reconf: MigReconfiguration, now) -> str:
    """Send this attempt's command unless it went out less than resend_s() ago; what was done, for the trail."""
    current = reconf.agent_command or {}
    fresh = (current.get("body") or {}).get("id") == command_id(reconf)
    if fresh and reconf.agent_command_sent_at and now - reconf.agent_command_sent_at < timedelta(seconds=resend_s()):
        return "sent"
    command = current if fresh else build_command(reconf)
    MigReconfiguration.objects.filter(pk=reconf.pk).update(agent_command=command, agent_command_sent_at=now)
    reconf.agent_command, reconf.agent_command_sent_at = command, now
    api_url = kube.api_url_for(reconf.cluster)
    cluster, node = reconf.cluster.name, reconf.node.name
    transaction.on_commit(lambda: _send(command, api_url, cluster, node))
    return "re-sent" if fresh else "sent"


def request_inventory(reconf: MigReconfiguration) -> None:
    """After commit, ask the node's agent for a fresh inventory (the verify step's rediscovery on this path)."""
    cluster_id, cluster, node = reconf.cluster_id, reconf.cluster.name, reconf.node.name
    transaction.on_commit(lambda: enqueue_inventory(cluster_id, cluster, [node]))


def _send(command: dict, api_url: str, cluster: str, node: str) -> None:
    apply_mig_task.apply_async((command, api_url), queue=node_queue(cluster, node), expires=resend_s() * 2)


def record_result(report) -> str:
    """Check and store a node agent's MIG result; "recorded", "duplicate" or "refused: why" (logged).

    Its signature must match the node it names, which must be the node of the reconfiguration whose
    current command it answers. The read-back inventory is written first (capacity's inventory ingest).
    """
    try:
        protocol.verify(report)
        if report["kind"] != protocol.KIND_MIG_RESULT:
            raise protocol.BadReport(f"kind {report['kind']!r} is not a MIG result")
        answered, applied, error, inventory = protocol.mig_result_from_body(report["body"])
        if inventory.get("node") != report["node"] or inventory.get("cluster") != report["cluster"]:
            raise protocol.BadReport("the inventory read back is of another node")
        reconf = (
            MigReconfiguration.objects.select_related("cluster", "node")
            .filter(pk=_reconf_pk(answered), cluster__name=report["cluster"], node__name=report["node"])
            .first()
        )
        if reconf is None or (reconf.agent_command.get("body") or {}).get("id") != answered:
            raise protocol.BadReport(f"command {answered} is not the current command of a reconfiguration of it")
    except protocol.BadReport as exc:
        who = f"{report.get('cluster')}/{report.get('node')}" if isinstance(report, dict) else "?"
        logger.warning("node agent MIG result refused: %s: %s", who, exc)
        return f"refused: {exc}"
    if result_of(reconf) is not None:
        return "duplicate"
    _, refused = ingest_inventory_reports([inventory])
    with transaction.atomic():
        reconf = MigReconfiguration.objects.select_for_update().select_related("cluster", "node").get(pk=reconf.pk)
        if result_of(reconf) is not None or (reconf.agent_command.get("body") or {}).get("id") != answered:
            return "duplicate"
        MigReconfiguration.objects.filter(pk=reconf.pk).update(agent_result=report, updated_at=timezone.now())
        what = f"node agent answered {answered}: " + (error or f"{len(applied)} GPU(s) set")
        if refused:
            what += f"; its inventory was refused ({'; '.join(refused)})"
        audit(reconf, Step.APPLY, Event.INFO, what, detail={"applied": applied, "error": error})
    return "recorded"


def _reconf_pk(answered: str) -> int:
    try:
        return int(answered[1:].split("-", 1)[0])
    except ValueError:
        raise protocol.BadReport(f"command id {answered!r} is not r<id>-<attempt>") from None
