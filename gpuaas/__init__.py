"""gpuaas: GPU-as-a-Service for on-premise Kubernetes GPU clusters."""

from core.celery import app as celery_app

__all__ = ("celery_app",)
