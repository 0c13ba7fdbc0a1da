"""`host_pollers`: whether any worker of a host has polled its queue (DescribeTaskQueue).

A run pinned to a host asks once, at its first call there, as a local activity of the worker
running the run (it reads Temporal, not a workspace): a host name no worker has (a typo)
then shows in `status` at once, not only when the call's first schedule-to-start probe fires
(workflows/hosts.py). The server remembers a poller for a few minutes: a host that died
moments ago still reads as polled, and its first probe tells."""

from __future__ import annotations

from temporalio import activity
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

from workflows.hosts import HostPollers


@activity.defn(name="host_pollers")
async def host_pollers(queue: str) -> HostPollers:
    info = activity.info()
    request = DescribeTaskQueueRequest(
        namespace=info.workflow_namespace,
        task_queue=TaskQueue(name=queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
    )
    answer = await activity.client().workflow_service.describe_task_queue(request)
    return HostPollers(polled=bool(answer.pollers))
