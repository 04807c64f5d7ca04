"""The pools approved requests hold, and the clusters each pool's units are on (PoolCluster)."""

from __future__ import annotations

from fractions import Fraction

from django.db import models
from django.db.models import Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from capacity.choices import SHARED_SPEC_KINDS, Binding, SpecKind, Tier
from capacity.models.reservations import Allocation
from tenancy.models import Project

from ..choices import (
    SHARE_PRIORITY_CLASSES,
    PoolClusterState,
    PoolState,
    SharePriority,
    WorkloadType,
)
from .requests import PoolRequest

LABEL_PREFIX = "gpuaas.io/"


def claim_template_name(pool_id: int, kind: str, profile_name: str = "") -> str:
    """The pool's ResourceClaimTemplate on a DRA cluster: `gpuaas-<pool>-gpu` or `gpuaas-<pool>-mig-<profile>`
    ("+" of a profile becomes ".", as in resource names). Written by pools.provisioning."""
    if kind == SpecKind.FULL:
        return f"gpuaas-{pool_id}-gpu"
    return f"gpuaas-{pool_id}-mig-{profile_name.replace('+', '.')}"


TIER_LABEL = f"{LABEL_PREFIX}tier"
CARD_ANNOTATIONS = ("units_total", "units_in_use", "gpus_total", "gpus_in_use", "shared_node")
# What a pool says when another project holds units on one of its nodes: under the device plugin
# (no DRA) the quota and node selector bind a pod to a count of units there, not to these units.
SHARED_NODE_NOTE = "shared node: binding is by count"


class GpuPoolQuerySet(models.QuerySet):
    def held(self):
        """Pools that still hold units (not released)."""
        return self.filter(released_at__isnull=True)

    def on_cluster(self, cluster):
        """Pools with units on `cluster`: as their home cluster, or as one of several (PoolCluster)."""
        return self.filter(Q(cluster=cluster) | Q(pk__in=PoolCluster.objects.filter(cluster=cluster).values("pool")))

    def with_clusters(self):
        """Prefetch each pool's clusters (PoolCluster, home first, with `units_held` now): one more query."""
        parts = PoolCluster.objects.with_units().select_related("cluster")
        home_first = models.Case(models.When(cluster=models.F("pool__cluster"), then=0), default=1)
        return self.prefetch_related(models.Prefetch("pool_clusters", queryset=parts.order_by(home_first, "pk")))

    def with_shares(self):
        """Prefetch each pool's held units with what their share of a GPU needs and whether each is in use
        (`held_units`), for GpuPool.gpu_shares(): one more query, whatever the number of pools."""
        held = Allocation.objects.active().annotate_busy().select_related("gpu__node").order_by("pk")
        return self.prefetch_related(models.Prefetch("allocations", queryset=held, to_attr="held_units"))

    def with_card(self):
        """Annotate the card's counts in the same query: units and GPUs, total and in use.

        Utilisation is monitoring's data: the layers that show it add it (monitoring.readers.cards.with_utilisation).
        Correlated subqueries rather than JOIN + COUNT(DISTINCT): the joins would multiply rows by
        allocations x workloads, and each subquery reads one pool's handful of allocations by index.
        """
        active = Allocation.objects.active().filter(pool=models.OuterRef("pk")).order_by()
        busy = active.in_use()

        def count(queryset, expression):
            total = queryset.values("pool").annotate(n=expression).values("n")
            return Coalesce(models.Subquery(total), 0)

        # OuterRef(OuterRef): the pool's own nodes are read one level further down, inside `neighbours`.
        own_nodes = Allocation.objects.active().filter(pool=models.OuterRef(models.OuterRef("pk"))).values("gpu__node")
        neighbours = (
            Allocation.objects.active().filter(gpu__node__in=own_nodes).exclude(project=models.OuterRef("project"))
        )
        return self.annotate(
            # Under DRA a pod gets exactly the pool's devices, so a shared node binds nothing by count.
            shared_node=models.Exists(neighbours) & ~models.Q(cluster__binding=Binding.DRA),
            units_total=count(active, models.Count("pk")),
            units_in_use=count(busy, models.Count("pk")),
            gpus_total=count(active, models.Count("gpu", distinct=True)),
            gpus_in_use=count(busy, models.Count("gpu", distinct=True)),
        )


class GpuPool(models.Model):
    """The units a project holds, by workload type and tier; dedicated to one project, never shared."""

    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="pools")
    request = models.OneToOneField(PoolRequest, on_delete=models.PROTECT, related_name="pool")
    cluster = models.ForeignKey("capacity.Cluster", on_delete=models.PROTECT, related_name="pools")
    name = models.CharField(max_length=100)
    workload_type = models.CharField(max_length=16, choices=WorkloadType)
    tier = models.CharField(max_length=8, choices=Tier, blank=True)
    tags = models.JSONField(default=list, blank=True)
    placement = models.CharField(
        max_length=200, blank=True, editable=False, help_text="Where the units sit, when that matters (one node)."
    )
    state = models.CharField(max_length=16, choices=PoolState, default=PoolState.PROVISIONING, editable=False)
    state_reason = models.TextField(blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now)
    released_at = models.DateTimeField(null=True, blank=True)
    # Provisioning in Kubernetes, tracked here (the admin and API read these, never Celery's results).
    attempts = models.PositiveIntegerField(default=0, editable=False, help_text="Provisioning attempts so far.")
    task_id = models.CharField(max_length=64, blank=True, editable=False)
    last_attempt_at = models.DateTimeField(null=True, blank=True, editable=False)
    provisioned_at = models.DateTimeField(null=True, blank=True, editable=False)
    claimed_by = models.CharField(
        max_length=64, blank=True, editable=False, help_text="The provisioning run holding the pool (task id)."
    )
    lease_expires_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="While provisioning: the sweep re-enqueues the pool once this passes (worker died, message lost).",
    )
    reconciled_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="Last time the periodic reconcile checked the cluster."
    )
    deprovisioned_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When quota and node labels were removed after release."
    )
    lending_enabled = models.BooleanField(
        default=False,
        help_text="Opt-in (off by default: a pool is its project's). When on, units idle for LENDING_IDLE_H may be "
        "lent to other projects as preemptible units; the pool gets them back within LENDING_RECLAIM_GRACE_S "
        "when its pods need them.",
    )
    share_priority = models.CharField(
        max_length=8,
        choices=SharePriority,
        default=SharePriority.NORMAL,
        help_text="Time-sliced and MPS pools: chosen by operators. Over-share enforcement evicts pods of "
        "lower-priority pools on a GPU first; the pool's ConfigMap names the matching PriorityClass for its pods.",
    )

    objects = GpuPoolQuerySet.as_manager()

    class Meta:
        ordering = ["project_id", "-created_at", "-id"]
        verbose_name = "GPU pool"
        indexes = [models.Index(fields=["cluster", "project", "released_at"], name="pools_pool_cluster_project")]

    def __str__(self) -> str:
        return f"{self.project.slug}/{self.name}"

    def clusters(self) -> list:
        """The clusters the pool holds units on, home cluster first: one PoolCluster each (approval writes
        them); a pool without any (made before pools could span clusters) is on its home cluster only."""
        spans = [part.cluster for part in self.pool_clusters.select_related("cluster").order_by("pk")]
        spans.sort(key=lambda c: c.pk != self.cluster_id)
        return spans or [self.cluster]

    def units_per_cluster(self) -> str:
        """Where the units are, as the admin and the dashboard print it: `c1 4, c2 1` (units held now, home
        cluster first). Reads the with_clusters() prefetch; "" for a pool without PoolCluster rows."""
        return ", ".join(f"{part.cluster.name} {part.units_held}" for part in self.pool_clusters.all())

    @property
    def pool_label(self) -> str:
        """Node label key marking the nodes that carry this pool's units."""
        return f"{LABEL_PREFIX}pool-{self.pk}"

    @property
    def quota_name(self) -> str:
        return f"gpuaas-{self.pk}"

    @property
    def binding(self) -> str:
        """How the pool's pods are bound to its units: the cluster's (capacity.choices.Binding)."""
        return self.cluster.binding

    @property
    def claim_template(self) -> str | None:
        """The ResourceClaimTemplate a workload references to get one of the pool's units (DRA clusters;
        None under the device plugin and for time-slice pools). docs/dra.md."""
        if self.cluster.binding != Binding.DRA or self.request.spec_kind not in (SpecKind.FULL, SpecKind.MIG):
            return None
        return claim_template_name(self.pk, self.request.spec_kind, self.request.profile_name)

    def scheduling(self) -> dict:
        """What the pool's pods carry to land on its nodes: the pool's node label and its tier's.

        Provisioning publishes it in the project's namespace (ConfigMap gpuaas-pool-<id>) and the
        API shows it; node affinity per tier is how the seed puts each tier's work on its nodes.
        """
        selector = {self.pool_label: "true"}
        if self.tier:
            selector[TIER_LABEL] = self.tier
        terms = [{"key": key, "operator": "In", "values": [value]} for key, value in selector.items()]
        required = {"nodeSelectorTerms": [{"matchExpressions": terms}]}
        return {
            "nodeSelector": selector,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}},
        }

    @property
    def is_shared(self) -> bool:
        """A time-sliced or MPS pool: its units are replicas of shared GPUs, and it has a share priority."""
        return self.request.spec_kind in SHARED_SPEC_KINDS

    @property
    def priority_class_name(self) -> str:
        """The Kubernetes PriorityClass its pods should carry (shared pools; SHARE_PRIORITY_CLASSES)."""
        return SHARE_PRIORITY_CLASSES[self.share_priority][0]

    def gpu_shares(self) -> tuple[Fraction, Fraction]:
        """(held, in use): the pool's units counted in GPUs, each as its share of a GPU
        (capacity.mig.share.held_share, as billing charges it). Reads with_shares(), else one query."""
        units = getattr(self, "held_units", None)
        if units is None:
            units = list(self.allocations.active().annotate_busy().select_related("gpu__node"))
        held = sum((u.share() for u in units), Fraction(0))
        return held, sum((u.share() for u in units if u.busy), Fraction(0))

    def card(self) -> dict:
        """The seed's pool card. Reads the with_card() annotations and with_shares() when present, else counts
        (3 queries and 1).

        GPUs (`total_gpus`, `in_use_gpus`) count each unit as its share of a GPU: one 3g.40gb of an H100
        is 0.5, six time-slice replicas of GPUs split 4 ways are 1.5. `gpus_touched` and
        `gpus_touched_in_use` are the physical GPUs the units sit on, whatever their share.
        """
        if not hasattr(self, "units_total"):
            annotated = GpuPool.objects.with_card().get(pk=self.pk)
            for name in CARD_ANNOTATIONS:
                setattr(self, name, getattr(annotated, name))
        held, in_use = self.gpu_shares()
        return {
            "name": self.name,
            "spec": self.request.spec_label if self.request_id else "",
            "total_gpus": gpu_count(held),
            "in_use_gpus": gpu_count(in_use),
            "gpus_touched": self.gpus_total,
            "gpus_touched_in_use": self.gpus_in_use,
            # Annotated by monitoring where the card shows it (monitoring.readers.cards); else not measured.
            "utilisation": getattr(self, "utilisation", None),
            "profiles_in_use": self.units_in_use,
            "profiles_total": self.units_total,
            "allocation": f"{self.units_in_use}/{self.units_total}",
            "tags": list(self.tags),
            "created": self.created_at.date().isoformat(),
            "shortfall": self.shortfall,
            "binding_note": SHARED_NODE_NOTE if self.shared_node else "",
        }

    @property
    def shortfall(self) -> int:
        """Units the request asked for that the pool no longer holds (an instance destroyed under it); 0 if whole."""
        if self.released_at is not None or not self.request_id:
            return 0
        held = (
            self.units_total
            if hasattr(self, "units_total")
            else self.allocations.filter(released_at__isnull=True).count()
        )
        return max(0, self.request.count - held)


class PoolClusterQuerySet(models.QuerySet):
    def with_units(self):
        """Annotate `units_held`: the pool's active allocations on that cluster (the allocations know their
        unit's cluster), in the same query."""
        held = (
            Allocation.objects.active()
            .filter(pool=models.OuterRef("pool"), gpu__node__cluster=models.OuterRef("cluster"))
            .order_by()
            .values("pool")
            .annotate(n=models.Count("pk"))
            .values("n")
        )
        return self.annotate(units_held=Coalesce(models.Subquery(held), 0))


class PoolCluster(models.Model):
    """One cluster a pool holds units on, and that cluster's provisioning (namespace, quota, labels, claim
    templates and placement written there). A pool on one cluster has one; a pool approved across
    clusters (PoolRequest.allow_multi_cluster) has one per cluster, its home cluster (GpuPool.cluster)
    among them. Provisioning, reconcile and clean-up after release run per row (pools/provisioning/).
    """

    pool = models.ForeignKey(GpuPool, on_delete=models.CASCADE, related_name="pool_clusters")
    cluster = models.ForeignKey("capacity.Cluster", on_delete=models.PROTECT, related_name="pool_clusters")
    units = models.PositiveIntegerField(default=0, editable=False, help_text="Units taken on this cluster at approval.")
    provisioned_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="Last time provisioning wrote this cluster successfully."
    )
    deprovisioned_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When this cluster was cleaned up after release."
    )
    reconciled_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="Last time the periodic reconcile checked this cluster."
    )
    error = models.TextField(blank=True, editable=False, help_text="The last Kubernetes error on this cluster.")

    objects = PoolClusterQuerySet.as_manager()

    class Meta:
        ordering = ["pool_id", "id"]
        constraints = [
            models.UniqueConstraint(fields=["pool", "cluster"], name="pools_poolcluster_unique_pool_cluster"),
        ]
        indexes = [models.Index(fields=["cluster", "pool"], name="pools_poolcluster_cluster")]

    def __str__(self) -> str:
        return f"{self.pool_id} on {self.cluster_id}"

    @property
    def state(self) -> PoolClusterState:
        """This cluster's provisioning (PoolClusterState), from its timestamps and last error: a Kubernetes
        error fails it until a provisioning or clean-up run succeeds there (which clears `error`)."""
        if self.deprovisioned_at is not None:
            return PoolClusterState.CLEANED_UP
        if self.error:
            return PoolClusterState.FAILED
        if self.pool.released_at is not None:
            return PoolClusterState.CLEANING_UP
        if self.provisioned_at is not None:
            return PoolClusterState.PROVISIONED
        return PoolClusterState.PROVISIONING


def gpu_count(share: Fraction) -> float:
    """A number of GPUs as the API and the screens give it: a sum of shares, to 4 decimal places."""
    return float(round(share, 4))
