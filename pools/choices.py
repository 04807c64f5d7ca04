"""Choice sets of the pools app."""

from django.db import models


class Isolation(models.TextChoices):
    MIG = "mig", "Hardware-isolated (MIG)"
    FULL = "full", "Full GPU"
    TIMESLICE = "timeslice", "Shared (time-slicing)"


class WorkloadType(models.TextChoices):
    INFERENCE = "inference", "Inference"
    STAGING = "staging", "Staging"
    DEVELOPMENT = "development", "Development"
    TRAINING = "training", "Training"


class RequestState(models.TextChoices):
    DRAFT = "draft", "Draft"
    SUBMITTED = "submitted", "Submitted"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    WITHDRAWN = "withdrawn", "Withdrawn"
    PROVISIONING = "provisioning", "Provisioning"
    ACTIVE = "active", "Active"
    RELEASED = "released", "Released"
    EXPIRED = "expired", "Expired"
    FAILED = "failed", "Failed"


class PoolState(models.TextChoices):
    PROVISIONING = "provisioning", "Provisioning"
    ACTIVE = "active", "Active"
    FAILED = "failed", "Failed"
    RELEASED = "released", "Released"
