"""Upgrading a database from before pricing existed: rate cards, their permissions and grants survive.

RateCard and RateCardEntry moved from billing to pricing without touching the tables; the content
types move with them (pricing.0001), so the Permission rows that users, groups and guardian's
object permissions point at now belong to pricing's models. The precedent is tenancy's move
(tests/tenancy/test_tenancy_upgrade.py).
"""

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from guardian.core import ObjectPermissionChecker

from billing.models import UsageRecord
from pricing.models import RateCard, RateCardEntry

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

FROM = datetime(2031, 1, 1, tzinfo=UTC)


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    state = executor.migrate(targets)
    ContentType.objects.clear_cache()
    return state.apps


def test_cards_content_types_and_permissions_survive_the_move():
    old = migrate([("pricing", None)])  # billing.0014: rate cards still in billing
    content_types = old.get_model("contenttypes", "ContentType").objects
    card_type = content_types.get(app_label="billing", model="ratecard")
    entry_type = content_types.get(app_label="billing", model="ratecardentry")
    assert not content_types.filter(app_label="pricing").exists()
    permission = old.get_model("auth", "Permission").objects
    change_card = permission.get(content_type=card_type, codename="change_ratecard")
    view_entry = permission.get(content_type=entry_type, codename="view_ratecardentry")
    user = old.get_model("auth", "User").objects.create(username="olga", is_staff=True)
    pricer = old.get_model("auth", "User").objects.create(username="piet", is_staff=True)
    group = old.get_model("auth", "Group").objects.create(name="Pricing desk")
    group.user_set.add(user)
    group.permissions.add(view_entry)
    user.user_permissions.add(change_card)
    card = old.get_model("billing", "RateCard").objects.create(
        name="Spring", effective_from=FROM, currency="EUR", vgpu_licence_hourly=Decimal("0.05")
    )
    entry = old.get_model("billing", "RateCardEntry").objects.create(
        card=card, kind="full", product="H100-80GB", hourly_price=Decimal("2.500000"), rule="full-GPU price"
    )
    old.get_model("guardian", "UserObjectPermission").objects.create(
        user=pricer, permission=change_card, content_type=card_type, object_pk=str(card.pk)
    )
    old.get_model("admin", "LogEntry").objects.create(
        user=user, content_type=card_type, object_id=str(card.pk), object_repr="Spring", action_flag=1
    )

    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    card = RateCard.objects.get(effective_from=FROM)
    assert (card.name, card.currency, card.vgpu_licence_hourly) == ("Spring", "EUR", Decimal("0.050000"))
    assert list(card.entries.values_list("pk", "product", "hourly_price")) == [
        (entry.pk, "H100-80GB", Decimal("2.500000"))
    ]
    assert ContentType.objects.get_for_model(RateCard).pk == card_type.pk
    assert ContentType.objects.get_for_model(RateCardEntry).pk == entry_type.pk
    assert not ContentType.objects.filter(app_label="billing", model__in=["ratecard", "ratecardentry"]).exists()
    assert UsageRecord._meta.get_field("rate_card").related_model is RateCard
    olga, piet = (get_user_model().objects.get(username=name) for name in ("olga", "piet"))
    assert olga.has_perm("pricing.change_ratecard") and olga.has_perm("pricing.view_ratecardentry")
    assert not olga.has_perm("billing.change_ratecard")
    assert not piet.has_perm("pricing.change_ratecard")  # an object permission only
    assert ObjectPermissionChecker(piet).has_perm("pricing.change_ratecard", card)
    assert LogEntry.objects.get(object_id=str(card.pk)).get_edited_object() == card
