"""A deployment counts as served only while a worker polls its work pool: the KB API sends an
upload's ingest there only then (else the run would wait for good and the job never end)."""

from __future__ import annotations

from tasks.dispatch import deployment_served


def test_a_deployment_is_served_only_while_a_worker_polls_its_pool() -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name="served-check", type="process"))
        flow_id = client.create_flow_from_name("served-check-flow")
        client.create_deployment(flow_id=flow_id, name="upload", work_pool_name="served-check")
        assert not deployment_served("served-check-flow/upload")  # registered, no worker: not served
        client.send_worker_heartbeat("served-check", "worker-1")
        assert deployment_served("served-check-flow/upload")
    assert not deployment_served("served-check-flow/missing")
