"""Clusters and their discovery runs."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from .. import credentials
from ..choices import Binding, ClusterStatus, DiscoveryStatus, OnboardingStatus


class Cluster(models.Model):
    """A registered Kubernetes cluster. Credentials are a kubeconfig path or an encrypted kubeconfig."""

    name = models.SlugField(max_length=63, unique=True)
    api_endpoint = models.CharField(max_length=500, blank=True, help_text="Informational; the kubeconfig decides.")
    kubeconfig_path = models.CharField(
        max_length=500,
        blank=True,
        help_text="Kubeconfig path on the gpuaas hosts (a reference, not a secret).",
    )
    kubeconfig_context = models.CharField(max_length=200, blank=True)
    in_cluster = models.BooleanField(default=False, help_text="Use the pod's service account (gpuaas runs inside).")
    encrypted_kubeconfig = models.TextField(blank=True, editable=False)
    dcgm_exporter_url = models.CharField(
        max_length=500, blank=True, help_text="Optional DCGM exporter endpoint(s) to scrape, comma-separated."
    )
    status = models.CharField(max_length=16, choices=ClusterStatus, default=ClusterStatus.NEW, editable=False)
    binding = models.CharField(
        max_length=16,
        choices=Binding,
        default=Binding.DEVICE_PLUGIN,
        editable=False,
        help_text="Set by discovery: DRA when NVIDIA's DRA driver publishes ResourceSlices (docs/dra.md).",
    )
    last_discovery_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_success_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_error = models.TextField(blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if not (self.kubeconfig_path or self.in_cluster or self.encrypted_kubeconfig):
            raise ValidationError({"kubeconfig_path": "Give a kubeconfig path, an uploaded kubeconfig or in-cluster."})

    def set_kubeconfig(self, text: str) -> None:
        """Store a kubeconfig encrypted; the plain text never reaches the database."""
        self.encrypted_kubeconfig = credentials.encrypt(text)

    def kubeconfig_text(self) -> str | None:
        return credentials.decrypt(self.encrypted_kubeconfig) if self.encrypted_kubeconfig else None


class DiscoveryRun(models.Model):
    """One discovery pass over a cluster: the admin and API read this, never Celery's results."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="discovery_runs")
    status = models.CharField(max_length=16, choices=DiscoveryStatus, default=DiscoveryStatus.RUNNING)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    nodes_seen = models.PositiveIntegerField(default=0)
    gpus_seen = models.PositiveIntegerField(default=0)
    nodes_gone = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    task_id = models.CharField(max_length=64, blank=True)

    # What a run found, as the admin's list and the API show it.
    SUMMARY_FIELDS = ("cluster", "status", "started_at", "finished_at", "nodes_seen", "gpus_seen", "nodes_gone")

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["cluster", "-started_at"], name="capacity_discoveryrun_recent")]

    def __str__(self) -> str:
        return f"{self.cluster} @ {self.started_at:%Y-%m-%d %H:%M:%S} ({self.status})"


class ClusterOnboarding(models.Model):
    """One onboarding apply into a cluster (capacity.services.onboarding): who, when, what each object did, and
    the cluster's error when it failed. The audit trail of onboarding; dry runs write nothing.

    Written once, when the apply has ended, so a row never shows an apply as further along than it got:
    `objects` lists exactly the objects the cluster accepted, in order, and a failed row names the one refused.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="onboardings")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    status = models.CharField(max_length=16, choices=OnboardingStatus)
    force = models.BooleanField(default=False, help_text="Took over fields other field managers owned.")
    objects_applied = models.JSONField(
        default=list, blank=True, help_text="[{kind, namespace, name, action}] in apply order: create/change/unchanged."
    )
    error = models.TextField(blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["cluster", "-started_at"], name="capacity_onboarding_recent")]

    def __str__(self) -> str:
        return f"{self.cluster} onboarding @ {self.started_at:%Y-%m-%d %H:%M:%S} ({self.status})"

    def counts(self) -> dict[str, int]:
        """How many objects were created, changed and left unchanged."""
        out = {"create": 0, "change": 0, "unchanged": 0}
        for obj in self.objects_applied:
            out[obj.get("action", "")] = out.get(obj.get("action", ""), 0) + 1
        return out
