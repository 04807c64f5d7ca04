"""Custom MIG layouts and time-slicing policies, written into the GPU Operator's ConfigMaps."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from ..choices import SharingStrategy
from ..mig.catalog import get_product
from ..mig.layout import validate_layout
from .clusters import Cluster

# gpuaas-owned mig-parted configs and device-plugin keys carry this prefix; nothing else is touched.
GPUAAS_CONFIG_PREFIX = "gpuaas-"
MAX_REPLICAS = 64

_layout_name = RegexValidator(
    r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "Lower-case letters, digits, '-' and '.' (it becomes a label value)."
)


class MigLayout(models.Model):
    """A custom MIG layout for one product, written into gpuaas's mig-parted ConfigMap as `gpuaas-<name>`.

    `gpus` is either {"all": [profiles]} (one layout for every GPU) or {"<index>": [profiles], ...}
    (only the listed GPUs change). A list of profiles means MIG on with those instances ([] = MIG on,
    no instances); null means MIG off.
    """

    name = models.CharField(max_length=50, unique=True, validators=[_layout_name])
    product = models.CharField(max_length=32, help_text="MIG catalog key, e.g. H100-80GB.")
    gpus = models.JSONField(
        default=dict,
        help_text='{"all": ["3g.40gb", "3g.40gb"]} or {"0": ["7g.80gb"], "1": ["1g.10gb", "1g.10gb"]}; null = MIG off.',
    )
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["product", "name"]
        verbose_name = "MIG layout"

    def __str__(self) -> str:
        return f"{self.name} ({self.product})"

    @property
    def config_name(self) -> str:
        """The mig-parted config name, i.e. the value of the node label nvidia.com/mig.config."""
        return GPUAAS_CONFIG_PREFIX + self.name

    def targets_for(self, gpu_indices) -> dict[int, list[str] | None]:
        """Target profiles per GPU index of a node with `gpu_indices`; GPUs not covered are left out."""
        if "all" in self.gpus:
            return {int(i): _copy_profiles(self.gpus["all"]) for i in gpu_indices}
        wanted = {int(k): _copy_profiles(v) for k, v in self.gpus.items()}
        return {i: wanted[i] for i in gpu_indices if i in wanted}

    def clean(self) -> None:
        try:
            product = get_product(self.product)
        except KeyError as exc:
            raise ValidationError({"product": exc.args[0]}) from None
        self.product = product.key
        if not isinstance(self.gpus, dict) or not self.gpus:
            raise ValidationError({"gpus": 'Give {"all": [...]} or per-GPU lists like {"0": [...]}.'})
        keys = set(self.gpus)
        if "all" in keys and len(keys) > 1:
            raise ValidationError({"gpus": '"all" cannot be combined with per-GPU entries.'})
        errors = []
        for key, profiles in sorted(self.gpus.items()):
            if key != "all" and not (isinstance(key, str) and key.isdigit() and int(key) < 64):
                errors.append(f"{key!r} is not a GPU index")
                continue
            if profiles is None:
                continue
            if not isinstance(profiles, list) or not all(isinstance(p, str) for p in profiles):
                errors.append(f"GPU {key}: give a list of profile names or null")
                continue
            result = validate_layout(product, profiles)
            if not result.valid:
                errors.append(f"GPU {key}: {result.reason}")
        if errors:
            raise ValidationError({"gpus": errors})


def _copy_profiles(value):
    return None if value is None else list(value)


# What an operator sets on a sharing policy (the admin's form and the API's writable fields).
SHARING_POLICY_FIELDS = (
    "cluster",
    "node_group",
    "strategy",
    "replicas",
    "pinned_memory_limit_mib",
    "active_thread_percentage",
    "rename_by_default",
    "fail_requests_greater_than_one",
    "enabled",
)


class TimeSlicingPolicy(models.Model):
    """GPU sharing for a node group: every GPU advertised as `replicas` nvidia.com/gpu (tier-3 slots),
    through time-slicing or MPS (`strategy`).

    Written into the device plugin's ConfigMap (key `config_key`) and selected by the node label
    nvidia.com/device-plugin.config. Time-slicing has NO memory isolation: replicas share the GPU's memory.
    MPS: the device plugin's MPS control daemon caps every client at memory / replicas and 100 / replicas %
    of the SMs (its config takes replicas only); an operator may cap clients lower still with
    `pinned_memory_limit_mib` and `active_thread_percentage`, which reach the pods as the CUDA MPS client
    variables (they can only tighten the daemon's limits; docs/tiers.md, "MPS").
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="time_slicing_policies")
    node_group = models.CharField(max_length=100, blank=True, help_text="Empty = every node of the cluster.")
    replicas = models.PositiveSmallIntegerField(
        default=4,
        validators=[MinValueValidator(2), MaxValueValidator(MAX_REPLICAS)],
        help_text="Pods (MPS: clients) per GPU, e.g. 4.",
    )
    rename_by_default = models.BooleanField(
        default=False, help_text="Advertise nvidia.com/gpu.shared instead of nvidia.com/gpu."
    )
    fail_requests_greater_than_one = models.BooleanField(default=True)
    strategy = models.CharField(
        max_length=16,
        choices=SharingStrategy,
        default=SharingStrategy.TIME_SLICING,
        help_text="MPS caps each client (the device plugin's MPS daemon sets the limits from the replicas).",
    )
    pinned_memory_limit_mib = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="MPS only: device memory per client in MiB, below the daemon's memory / replicas "
        "(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT). Empty: memory / replicas.",
    )
    active_thread_percentage = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="MPS only: % of the SMs per client, at most 100 / replicas (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE). "
        "Empty: 100 / replicas.",
    )
    enabled = models.BooleanField(default=True)
    applied_at = models.DateTimeField(null=True, blank=True, editable=False)
    nodes_labelled = models.PositiveIntegerField(default=0, editable=False)
    last_error = models.TextField(blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["cluster_id", "node_group"]
        verbose_name = "GPU sharing policy (time-slicing / MPS)"
        verbose_name_plural = "GPU sharing policies (time-slicing / MPS)"
        constraints = [
            models.UniqueConstraint(fields=["cluster", "node_group"], name="capacity_timeslicingpolicy_unique_group"),
            models.CheckConstraint(condition=Q(replicas__gte=2), name="capacity_timeslicingpolicy_replicas_gte_2"),
            models.CheckConstraint(
                condition=Q(strategy=SharingStrategy.MPS)
                | Q(pinned_memory_limit_mib__isnull=True, active_thread_percentage__isnull=True),
                name="capacity_timeslicingpolicy_client_limits_mps_only",
            ),
            models.CheckConstraint(
                condition=Q(active_thread_percentage__isnull=True)
                | Q(active_thread_percentage__gte=1, active_thread_percentage__lte=100),
                name="capacity_timeslicingpolicy_thread_pct_range",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.cluster}/{self.node_group or '*'}: {self.replicas}x {self.strategy}"

    def clean(self) -> None:
        """Field-keyed messages for client limits: MPS only, and never above what the daemon gives each client
        (a client's own limit can only tighten the daemon's: NVIDIA MPS docs, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)."""
        errors: dict[str, str] = {}
        mps = self.strategy == SharingStrategy.MPS
        replicas = self.replicas or 0
        if not mps:
            for name in ("pinned_memory_limit_mib", "active_thread_percentage"):
                if getattr(self, name) is not None:
                    errors[name] = "Only an MPS policy limits its clients; set strategy to mps or leave this empty."
        elif self.active_thread_percentage is not None and replicas >= 2:
            ceiling = 100 // replicas
            if not 1 <= self.active_thread_percentage <= ceiling:
                errors["active_thread_percentage"] = (
                    f"Give 1 to {ceiling}: with {replicas} clients per GPU the MPS daemon already caps each at "
                    f"{ceiling} %, and a client's own limit can only be lower."
                )
        if mps and self.pinned_memory_limit_mib is not None and self.pinned_memory_limit_mib < 1:
            errors["pinned_memory_limit_mib"] = "Give at least 1 MiB."
        if errors:
            raise ValidationError(errors)

    def client_limits(self, memory_mib: int) -> dict | None:
        """MPS only: what each client of a GPU with `memory_mib` gets. The device plugin's MPS control daemon sets
        set_default_device_pinned_mem_limit = memory / replicas and set_default_active_thread_percentage =
        100 / replicas (NVIDIA/k8s-device-plugin cmd/mps-control-daemon/mps/daemon.go); the operator's limits,
        when set, tighten those (never loosen: the lower one wins)."""
        if self.strategy != SharingStrategy.MPS:
            return None
        memory = memory_mib // self.replicas
        threads = 100 // self.replicas
        if self.pinned_memory_limit_mib is not None:
            memory = min(memory, self.pinned_memory_limit_mib)
        if self.active_thread_percentage is not None:
            threads = min(threads, self.active_thread_percentage)
        return {"pinned_memory_mib": memory, "active_thread_percentage": threads}

    @property
    def client_environment(self) -> dict[str, str]:
        """The CUDA MPS client variables that carry the operator's tighter limits into a pod ({} when none):
        CUDA_MPS_PINNED_DEVICE_MEM_LIMIT ("<device>=<size>", device 0: an MPS pod gets one replica, the
        plugin refuses more) and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (NVIDIA MPS docs, "Environment Variables")."""
        if self.strategy != SharingStrategy.MPS:
            return {}
        env = {}
        if self.pinned_memory_limit_mib is not None:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={self.pinned_memory_limit_mib}M"
        if self.active_thread_percentage is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(self.active_thread_percentage)
        return env

    @property
    def config_key(self) -> str:
        """Key in the device-plugin ConfigMap; the replica count is in the name so a change relabels nodes."""
        group = self.node_group or "all"
        safe = "".join(c if c.isalnum() or c in "-." else "-" for c in group.lower()).strip("-.") or "group"
        mps = "-mps" if self.strategy == SharingStrategy.MPS else ""
        return f"{GPUAAS_CONFIG_PREFIX}{safe}{mps}-x{self.replicas}"
