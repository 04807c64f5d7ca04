"""One unit count: pool cards, the project page, the operator dashboard and the API count a held unit as its
share of a GPU (capacity.mig.share, the rule billing charges by), for a MIG unit, a full GPU and time-slice
replicas alike; GPUs touched appear only under that name."""

from fractions import Fraction

import pytest
from dashboard_world import H100, _allocate, _gpu, _instance, _node, _pool
from rest_framework.test import APIClient

from billing.services.clock import units_of
from capacity.models import Cluster
from pools.models import Allocation

pytestmark = pytest.mark.django_db

# A 3g.40gb of an H100 (4 of 8 memory slices), a whole GPU, and 6 replicas of GPUs time-sliced 4 ways.
EXPECTED = {"mig": 0.5, "full": 1.0, "ts": 1.5}


@pytest.fixture
def held(project):
    cluster = Cluster.objects.create(name="c", kubeconfig_path="/tmp/c", status="ok")
    mig_gpu = _gpu(_node(cluster, "m1", H100, 1, mig_strategy="mixed"), 0, H100, "H100-80GB", True)
    full_gpu = _gpu(_node(cluster, "f1", H100, 1), 0, H100, "H100-80GB", False)
    sliced = _node(cluster, "t1", H100, 2, timeslice_replicas=4)
    sliced_gpus = [_gpu(sliced, i, H100, "H100-80GB", False) for i in range(2)]
    pools = {
        "mig": _pool(project, cluster, "mig", "mig", "3g.40gb", 1),
        "full": _pool(project, cluster, "full", "full", "", 1),
        "ts": _pool(project, cluster, "ts", "timeslice", "", 6),
    }
    _allocate(pools["mig"], mig_gpu, _instance(mig_gpu, "3g.40gb", 0))
    _allocate(pools["full"], full_gpu)
    for n in range(6):
        Allocation.objects.create(
            pool=pools["ts"],
            project=project,
            kind="timeslice",
            gpu=sliced_gpus[n // 4],
            replica=n % 4,
            resource_name="nvidia.com/gpu",
            product="H100-80GB",
            compute_slices=7,
        )
    return cluster, pools


def test_billing_charges_the_shares_every_screen_counts(held):
    """The rule the screens use is the one billing charges by: its units' shares sum to the same GPUs."""
    _, pools = held
    for name, pool in pools.items():
        shares = sum((unit.share() for unit in units_of(Allocation.objects.filter(pool=pool))), Fraction(0))
        assert float(shares) == EXPECTED[name], name


def test_pool_cards_project_page_dashboard_and_api_agree(client, held, bob, operator):
    cluster, pools = held
    client.force_login(bob)
    page = client.get("/projects/team-a/")
    cards = {card["name"]: card for card in page.context["pools"]}
    assert {name: card["total_gpus"] for name, card in cards.items()} == EXPECTED
    # GPUs touched, under that name only: the 3g.40gb sits on 1 GPU, the six replicas on 2.
    assert {name: card["gpus_touched"] for name, card in cards.items()} == {"mig": 1, "full": 1, "ts": 2}
    html = page.content.decode()
    assert '<dd data-gpus="0.5" title="Each unit counted as its share of a GPU">0.5</dd>' in html
    assert '<dd data-gpus="1.5" title="Each unit counted as its share of a GPU">1.5</dd>' in html

    # The project page's profile distribution: the replicas are time-slice units, not "Full" ones.
    rows = {row["shape"]: row for row in page.context["profiles"]}
    assert (rows["3g"]["total"], rows["3g"]["gpus"]) == (1, 0.5)
    assert (rows["full"]["total"], rows["full"]["gpus"]) == (1, 1.0)
    assert (rows["timeslice"]["label"], rows["timeslice"]["total"], rows["timeslice"]["gpus"]) == ("Time-slice", 6, 1.5)

    api = APIClient()
    api.force_authenticate(bob)
    listed = api.get("/api/v1/pools/", {"page_size": 50}).json()["results"]
    assert {row["name"]: row["total_gpus"] for row in listed} == EXPECTED
    assert {row["name"]: row["gpus_touched"] for row in listed} == {"mig": 1, "full": 1, "ts": 2}

    client.force_login(operator)
    data = client.get("/admin/dashboard/data.json").json()
    (card,) = [c for c in data["clusters"] if c["id"] == cluster.pk]
    assert card["gpu_equivalents"]["allocated"] == sum(EXPECTED.values())  # 3.0 GPUs held of 4 present
    assert card["gpu_equivalents"]["free"] == 4 - sum(EXPECTED.values())
    assert "a 3g.40gb of an H100 is 1/2 of a GPU" in data["gpus_note"]
    assert "3/7" not in data["gpus_note"]


def test_the_admin_pool_list_gives_gpus_as_shares(client, held, operator):
    client.force_login(operator)
    html = client.get("/admin/pools/gpupool/").content.decode()
    assert "GPUs in use / held (shares)" in html
    assert '<td class="field-gpus">0/1.5</td>' in html and '<td class="field-gpus">0/0.5</td>' in html
