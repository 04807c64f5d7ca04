"""Temporary: pools/models/queue.py's old path, for the modules moving to the scheduling app (queue, policies,
forecast, queue_order, queue_admin) until their imports follow (/work/notes/poolsplit_sed.sh); then delete this."""

from .models.queue import *  # noqa: F403
