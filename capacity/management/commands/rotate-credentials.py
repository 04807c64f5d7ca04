"""`python manage.py rotate-credentials`: re-encrypt stored kubeconfigs under the first CREDENTIALS_KEYS key."""

from django.core.management.base import BaseCommand, CommandError

from capacity.services.clusters import UndecryptableCredentials, rotate_credentials


class Command(BaseCommand):
    help = (
        "Re-encrypt every stored cluster credential with the first key of CREDENTIALS_KEYS (all or nothing;"
        " idempotent). Afterwards the other keys can be removed."
    )

    def handle(self, *args, **options):
        try:
            rotated, current = rotate_credentials()
        except UndecryptableCredentials as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"{rotated} stored credential(s) re-encrypted with the first key, {current} already were")
