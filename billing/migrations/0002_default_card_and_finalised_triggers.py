"""Seed the default rate card (BILLING_DEFAULT_GPU_HOURLY) and make finalised statements immutable in the database.

The triggers (billing/triggers.py) refuse UPDATE/DELETE of a finalised statement and
INSERT/UPDATE/DELETE of its lines, whatever the application does (QuerySet.update(), raw SQL).
"""

from datetime import UTC, datetime

from django.conf import settings
from django.db import migrations

EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


def seed_default_card(apps, schema_editor):
    from pricing.rates import default_entries

    RateCard = apps.get_model("billing", "RateCard")
    RateCardEntry = apps.get_model("billing", "RateCardEntry")
    if RateCard.objects.filter(effective_from=EPOCH).exists():
        return
    card = RateCard.objects.create(
        name="Default",
        effective_from=EPOCH,
        currency=settings.BILLING_CURRENCY,
        notes="Seeded from BILLING_DEFAULT_GPU_HOURLY.",
    )
    RateCardEntry.objects.bulk_create(
        RateCardEntry(
            card=card,
            kind=key.kind,
            product=key.product,
            profile_name=key.profile_name,
            replicas=key.replicas,
            hourly_price=price,
            rule=rule,
        )
        for key, price, rule in default_entries(settings.BILLING_DEFAULT_GPU_HOURLY)
    )


def create_triggers(apps, schema_editor):
    from billing import triggers

    triggers.create(schema_editor)


def drop_triggers(apps, schema_editor):
    from billing import triggers

    triggers.drop(schema_editor)


class Migration(migrations.Migration):
    dependencies = [("billing", "0001_initial")]

    operations = [
        migrations.RunPython(seed_default_card, migrations.RunPython.noop),
        migrations.RunPython(create_triggers, drop_triggers),
    ]
