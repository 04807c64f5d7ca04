"""`python manage.py issue_token USERNAME NAME [--days N]`: create a personal API token, print its key once.

For bootstrapping and scripts; users create and revoke their own tokens through /api/v1/tokens/.
"""

import datetime as dt

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from tenancy.models import ApiToken


class Command(BaseCommand):
    help = "Create an API token for a user and print its key (shown this once; only a digest is stored)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("name", help="What the token is for, e.g. 'ci'.")
        parser.add_argument(
            "--days",
            type=int,
            default=None,
            help="Expire after this many days (default and most: API_TOKEN_MAX_LIFETIME_DAYS; never if that is 0).",
        )

    def handle(self, *args, username, name, days, **options):
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise CommandError(f"no active user {username!r}")
        if days is not None and days < 1:
            raise CommandError("--days must be at least 1")
        most = settings.API_TOKEN_MAX_LIFETIME_DAYS
        if days is not None and most and days > most:
            raise CommandError(f"--days must be at most {most} (API_TOKEN_MAX_LIFETIME_DAYS)")
        expires_at = timezone.now() + dt.timedelta(days=days) if days else None
        _, key = ApiToken.issue(user, name, expires_at)
        self.stdout.write(key)
