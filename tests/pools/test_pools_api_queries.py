"""List endpoints cost the same number of queries at page size 10 and 100 (token auth included)."""

import pytest
from rest_framework.test import APIClient

from capacity.models import WorkloadProfile
from pools.models import Allocation, GpuPool, PoolRequest
from tenancy.models import ApiToken

pytestmark = pytest.mark.django_db
ROWS = 110


@pytest.fixture
def busy_project(fleet, project, other_project, bob):
    """110 requests, pools and time-slice allocations in team-a, some with workloads; a few in team-b."""
    node = fleet.timeslice_node("ts", gpus=30, replicas=4)
    gpus = list(node.gpus.order_by("index"))
    for target, count in ((project, ROWS), (other_project, 5)):
        requests = PoolRequest.objects.bulk_create(
            PoolRequest(
                project=target,
                requested_by=bob,
                isolation="timeslice",
                tier="3",
                spec_kind="timeslice",
                product="H100-80GB",
                count=1,
                state="active",
            )
            for _ in range(count)
        )
        pools = GpuPool.objects.bulk_create(
            GpuPool(
                project=target,
                request=r,
                cluster=node.cluster,
                name=f"p{r.pk}",
                workload_type="development",
                tier="3",
                state="active",
            )
            for r in requests
        )
        offset = 0 if target == project else ROWS
        Allocation.objects.bulk_create(
            Allocation(
                pool=p,
                project=target,
                kind="timeslice",
                gpu=gpus[(offset + i) // 4],
                replica=(offset + i) % 4,
                resource_name="nvidia.com/gpu",
                product="H100-80GB",
                compute_slices=2,
            )
            for i, p in enumerate(pools)
        )
    WorkloadProfile.objects.bulk_create(
        WorkloadProfile(
            cluster=node.cluster,
            namespace="team-a",
            pod_name=f"pod{i}",
            pod_uid=f"u{i}",
            node=node,
            gpu=gpus[0],
            resource_name="nvidia.com/gpu",
            project=project,
        )
        for i in range(3)
    )
    return project


@pytest.fixture
def token_client(bob):
    _, key = ApiToken.issue(bob, "bench")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    client.get("/api/v1/projects/")  # first use records last_used_at; later requests skip that write
    return client


# token lookup, the caller's project ids (tenancy.roles.project_ids_of: read once per request, then literals),
# COUNT(*), the page (joins and annotations inside); projects: the same four; pools: two more, the page's
# clusters (PoolCluster with units held, prefetched) and its held units (their shares of a GPU, prefetched).
EXPECTED = {"/api/v1/pool-requests/": 4, "/api/v1/allocations/": 4, "/api/v1/pools/": 6, "/api/v1/projects/": 4}


@pytest.mark.parametrize("url", list(EXPECTED))
@pytest.mark.parametrize("page_size", [10, 100])
def test_list_query_count_is_constant(busy_project, token_client, django_assert_num_queries, url, page_size):
    with django_assert_num_queries(EXPECTED[url]):
        response = token_client.get(url, {"page_size": page_size})
    assert response.status_code == 200
    expected_rows = 1 if url == "/api/v1/projects/" else min(page_size, ROWS)
    assert len(response.data["results"]) == expected_rows


def test_cards_in_the_list_count_workloads(busy_project, token_client):
    rows = token_client.get("/api/v1/pools/", {"page_size": 200, "ordering": "id"}).data["results"]
    assert len(rows) == ROWS
    in_use = [(row["name"], row["allocation"]) for row in rows if row["profiles_in_use"]]
    first_three = [p.name for p in GpuPool.objects.filter(project=busy_project).order_by("id")[:3]]
    assert in_use == [(name, "1/1") for name in first_three]
