"""The dry run and matched requests through the API: ranked offers with prices, the chosen offer stored with why."""

import datetime as dt

import pytest
from django.utils import timezone

from capacity.models import NodeCapacity
from pools import services
from pools.models import PoolRequest
from pricing.services import seed_default_card

pytestmark = pytest.mark.django_db

URL = "/api/v1/pool-requests/"
DRY_RUN = f"{URL}dry-run/"


@pytest.fixture
def dev_fleet(fleet):
    fleet.mig_node("mig", [["3g.40gb", "3g.40gb"], ["1g.10gb"] * 7], tier="2")
    fleet.timeslice_node("shared", gpus=2, replicas=4)
    fleet.timeslice_node("shared-h200", gpus=1, replicas=4, product="H200-141GB")
    fleet.full_node("train", gpus=8)
    seed_default_card()
    return fleet


def test_dry_run_ranks_offers_with_prices_and_forecast(api, bob, dev_fleet):
    response = api(bob).post(DRY_RUN, {"workload_type": "development", "memory_gib": 8}, format="json")
    assert response.status_code == 200, response.data
    chosen = response.data["chosen"]
    assert (chosen["kind"], chosen["product"], chosen["tier"], chosen["hourly_price"], chosen["forecast"]) == (
        "timeslice",
        "H100-80GB",
        "3",
        "0.625000",
        "free now",
    )
    assert chosen["forecast_start"] is not None
    assert [o["offer"] for o in response.data["offers"]][:2] == [
        "time-slicing (H100-80GB, 1/4)",
        "time-slicing (H200-141GB, 1/4)",
    ]
    assert response.data["declared"]["isolation"] == "none"
    assert not PoolRequest.objects.exists()


def test_dry_run_says_when_units_are_short(api, bob, dev_fleet):
    response = api(bob).post(DRY_RUN, {"workload_type": "inference", "memory_gib": 30, "count": 3}, format="json")
    assert response.status_code == 200
    assert response.data["chosen"]["offer"] == "MIG 3g.40gb (H100-80GB)"
    assert response.data["chosen"]["forecast"] == "waits: 0 of 3 units free on one cluster"
    assert response.data["chosen"]["forecast_start"] is None


def test_dry_run_forecasts_a_start_when_held_units_free_later(api, bob, operator, make_request, dev_fleet):
    """Both 3g.40gb instances are held until a known end: the waiting offer's start is the queue's forecast."""
    held = make_request(count=2, tier="2", end_at=timezone.now() + dt.timedelta(hours=48))
    services.approve(held, actor=operator)
    response = api(bob).post(DRY_RUN, {"workload_type": "inference", "memory_gib": 30, "count": 2}, format="json")
    assert response.status_code == 200, response.data
    chosen = response.data["chosen"]
    assert chosen["offer"] == "MIG 3g.40gb (H100-80GB)"
    assert chosen["forecast"].startswith("waits: 0 of 2 units free on one cluster; likely start P50 ")
    start = dt.datetime.fromisoformat(chosen["forecast_start"])
    assert timezone.now() + dt.timedelta(hours=47) < start <= timezone.now() + dt.timedelta(hours=49)


def test_dry_run_refuses_bad_input(api, bob):
    response = api(bob).post(DRY_RUN, {"memory_gib": 0, "isolation": "total"}, format="json")
    assert response.status_code == 400
    assert set(response.data) == {"memory_gib", "isolation"}


def test_dry_run_needs_sign_in(api):
    assert api().post(DRY_RUN, {"memory_gib": 8}, format="json").status_code in (401, 403)


def test_request_from_declared_needs_stores_the_offer_and_why(api, bob, project, dev_fleet):
    body = {"project": project.pk, "workload_type": "development", "memory_gib": 8, "count": 1}
    response = api(bob).post(URL, body, format="json")
    assert response.status_code == 201, response.data
    data = response.data
    assert (data["spec_kind"], data["tier"], data["product"], data["declared_isolation"]) == (
        "timeslice",
        "3",
        "H100-80GB",
        "none",
    )
    assert data["offer"]["offer"] == "time-slicing (H100-80GB, 1/4)"
    assert data["offer_reason"].startswith("chose time-slicing (H100-80GB, 1/4): meets every declared need")
    assert "MIG 1g.10gb (H100-80GB): ranked lower (tier 2 comes after tier 3 for this workload)" in data["offer_reason"]


def test_training_60_gib_gets_a_full_gpu(api, bob, project, dev_fleet):
    body = {"project": project.pk, "workload_type": "training", "memory_gib": 60}
    response = api(bob).post(URL, body, format="json")
    assert response.status_code == 201, response.data
    assert (response.data["spec_kind"], response.data["tier"], response.data["spec"]) == (
        "full",
        "full",
        "H100-80GB full GPU",
    )


def test_200_gib_on_a_time_sliced_h200_is_refused(api, bob, project, dev_fleet):
    body = {"project": project.pk, "isolation": "timeslice", "product": "H200-141GB", "memory_gib": 200}
    response = api(bob).post(URL, body, format="json")
    assert response.status_code == 400
    assert response.data == {
        "memory_gib": [
            "time-slicing (H200-141GB, 1/4): a replica's share of the GPU's memory is 35.2 GiB (141 GiB / 4),"
            " you asked for 200 GiB"
        ]
    }
    assert not PoolRequest.objects.exists()


def test_no_offer_is_a_400_with_every_reason(api, bob, project, dev_fleet):
    body = {"project": project.pk, "workload_type": "development", "memory_gib": 500}
    response = api(bob).post(URL, body, format="json")
    assert response.status_code == 400
    assert set(response.data) == {"memory_gib"}
    assert "full GPU (H100-80GB): one GPU has 80 GiB, you asked for 500 GiB" in response.data["memory_gib"]


def test_long_inference_is_never_time_sliced(api, bob, project, dev_fleet):
    end = (timezone.now() + dt.timedelta(days=30)).isoformat()
    body = {"project": project.pk, "workload_type": "inference", "memory_gib": 8, "isolation": "none", "end_at": end}
    response = api(bob).post(URL, body, format="json")
    assert response.status_code == 201, response.data
    assert response.data["spec_kind"] == "mig"
    assert "no performance guarantee for a long-running inference service" in response.data["offer_reason"]


def test_mps_request_takes_mps_replicas_only(api, bob, operator, project, fleet):
    fleet.timeslice_node("plain", gpus=1, replicas=4)
    mps = fleet.timeslice_node("mps", gpus=1, replicas=4)
    NodeCapacity.objects.filter(pk=mps.pk).update(sharing_strategy="mps")
    body = {"project": project.pk, "workload_type": "development", "memory_gib": 8, "submit": True}
    response = api(bob).post(URL, body, format="json")
    assert response.status_code == 201, response.data
    assert (response.data["isolation"], response.data["spec"]) == ("mps", "H100-80GB MPS replica")
    request = PoolRequest.objects.get(pk=response.data["id"])
    pool = services.approve(request, actor=operator)
    assert set(pool.allocations.values_list("gpu__node__name", flat=True)) == {"mps"}
