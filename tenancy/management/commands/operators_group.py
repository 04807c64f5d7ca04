"""`python manage.py operators_group [--add USERNAME ...]`: create or refresh the Operators group.

The group holds every permission of the tenancy, pools, capacity, billing and monitoring apps (re-run it after
a migration adds permissions). An operator is an active staff user in this group; --add makes the
named users exactly that.
"""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from tenancy.roles import OPERATORS_GROUP, operators_group


class Command(BaseCommand):
    help = "Create or refresh the Operators group (all operator permissions); --add makes users operators."

    def add_arguments(self, parser):
        parser.add_argument("--add", nargs="+", default=[], metavar="USERNAME", help="Make these users operators.")

    @transaction.atomic
    def handle(self, *args, add, **options):
        users = list(get_user_model().objects.filter(username__in=add, is_active=True))
        missing = sorted(set(add) - {u.username for u in users})
        if missing:
            raise CommandError(f"no active user(s) {', '.join(missing)}: create them first (nothing was changed)")
        group = operators_group()
        for user in users:
            if not user.is_staff:
                user.is_staff = True
                user.save(update_fields=["is_staff"])
            group.user_set.add(user)
        self.stdout.write(f"{OPERATORS_GROUP}: {group.permissions.count()} permissions, {group.user_set.count()} users")
