"""The Celery app: settings from Django (CELERY_*), tasks autodiscovered from the apps."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuaas.settings")

app = Celery("gpuaas")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def node_queue(cluster_name: str, node_name: str) -> str:
    """The queue a node's agent consumes: node-agent work (NVML) must run on that node."""
    return f"node.{cluster_name}.{node_name}"
