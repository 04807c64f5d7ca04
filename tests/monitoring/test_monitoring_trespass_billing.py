"""Billing of trespass: the trespasser's project pays the list rate for the time (a line on its statement),
the owner is not billed "used" for it."""

from datetime import timedelta
from decimal import Decimal

import pytest
import trespass_sim
from django.utils import timezone

from billing import measurements
from billing.choices import LineType
from billing.models import StatementLine
from billing.periods import floor_hour, month_start
from billing.services import generate_statement
from billing.services.lines import round_money
from monitoring.models import TrespassEvent
from monitoring.services.trespass import detect_trespass
from pricing.rates import spec_key
from pricing.services import PriceBook, seed_default_card

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim(tmp_path):
    sim = trespass_sim.start(tmp_path)
    yield sim
    sim.server.stop()


def test_the_trespasser_pays_the_list_rate_for_the_time_and_the_owner_not_used(sim):
    seed_default_card()
    sim.run_pod("team-acme", "ok-1")
    sim.run_pod("team-acme", "ok-2")
    sim.discover()
    detect_trespass(sim.cluster.pk)  # one poll
    event = TrespassEvent.objects.get()
    hour = floor_hour(timezone.now())
    started, ended = hour + timedelta(minutes=10), hour + timedelta(minutes=40)
    TrespassEvent.objects.filter(pk=event.pk).update(started_at=started, ended_at=ended)

    statement = generate_statement(sim.acme, month_start(started.date()))

    (line,) = StatementLine.objects.filter(statement=statement, line_type=LineType.TRESPASS)
    book = PriceBook()
    rate = book.price(book.card_at(hour), spec_key("mig", "H100-80GB", "3g.40gb"), 3)
    assert rate > 0
    assert line.hourly_rate == rate
    assert line.hours == Decimal("0.5000")
    assert line.amount == round_money(rate / 2)
    assert "another project's" in line.description and "vision" not in line.description
    assert statement.total_amount >= line.amount
    # vision, the owner, pays no trespass line; its "used" leaves out the trespass half hour.
    vision = generate_statement(sim.vision, month_start(started.date()))
    assert not StatementLine.objects.filter(statement=vision, line_type=LineType.TRESPASS).exists()
    (held,) = sim.vision.allocations.all()
    unit = measurements.MeteredUnit(held.pk, held.gpu_id, held.mig_instance_id, "mig", share=1)
    assert measurements._trespass_seconds([unit], hour) == {held.pk: 1800}
