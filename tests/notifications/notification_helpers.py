"""Helpers of the notification tests."""

DELIVER_TASK = "notifications.tasks.deliver_task"
FAN_OUT_TASK = "notifications.tasks.fan_out_task"


def task_name(callback) -> str | None:
    """The Celery task an on_commit callback would enqueue (delay_on_commit), else None."""
    task = getattr(getattr(callback, "func", None), "__self__", None)
    return getattr(task, "name", None)
