"""Choice sets of the tenancy app."""

from django.db import models


class Role(models.TextChoices):
    ADMIN = "admin", "Project admin"
    MEMBER = "member", "Member"
    VIEWER = "viewer", "Viewer"
