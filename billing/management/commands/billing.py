"""`python manage.py billing seed-rates | meter | close YYYY-MM`: billing chores from the shell."""

from __future__ import annotations

from datetime import UTC, datetime

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from billing import services
from billing.models import MonthNotEnded
from billing.periods import parse_period


def _hour(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(f"{text!r} is not an ISO date-time such as 2026-04-01T00:00Z") from None
    return value if timezone.is_aware(value) else value.replace(tzinfo=UTC)


class Command(BaseCommand):
    help = "Seed a rate card from BILLING_DEFAULT_GPU_HOURLY, meter usage now, or close a month."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        seed = sub.add_parser("seed-rates", help="Create the default card (or one effective from a future hour).")
        seed.add_argument("--effective-from", help="Whole UTC hour, e.g. 2026-04-01T00:00Z (default: the seed card).")
        seed.add_argument("--name", default="")
        meter = sub.add_parser("meter", help="Meter every complete hour up to now (or --until).")
        meter.add_argument("--until", help="Meter hours before this ISO date-time.")
        close = sub.add_parser("close", help="Meter up to the month's end and make every project's draft statement.")
        close.add_argument("month", help="YYYY-MM (UTC).")

    def handle(self, *args, action, **options):
        if action == "seed-rates":
            if options["effective_from"]:
                start = _hour(options["effective_from"])
                try:
                    card = services.create_rate_card(
                        name=options["name"] or f"Rates from {start:%Y-%m-%d %H:00}",
                        effective_from=start,
                        full_prices=services.default_full_prices(),
                        notes="Created by manage.py billing seed-rates from BILLING_DEFAULT_GPU_HOURLY.",
                    )
                except ValueError as exc:
                    raise CommandError(str(exc)) from None
                created = True
            else:
                card, created = services.seed_default_card()
            verb = "created" if created else "already present"
            self.stdout.write(f"{card} {verb}: {card.entries.count()} entries")
        elif action == "meter":
            until = _hour(options["until"]) if options["until"] else None
            result = services.meter_usage(until=until)
            self.stdout.write(
                f"metered {result.hours} hour(s), {result.records} record(s); until {result.metered_until}"
            )
        elif action == "close":
            try:
                period = parse_period(options["month"])
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            try:
                statements = services.close_month(period)
            except MonthNotEnded as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(f"{len(statements)} statement(s) for {period:%Y-%m}")
