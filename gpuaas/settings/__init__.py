"""gpuaas settings: one env-driven namespace, written in parts.

With no environment set, gpuaas runs embedded: SQLite under var/, kombu's SQLAlchemy broker on
a SQLite file under var/, and the built-in simulated cluster. Set DATABASE_URL, CELERY_BROKER_URL and register
clusters with real kubeconfigs to run on PostgreSQL, Redis and real clusters. See README.md.

The settings are one namespace read from the environment, written in parts (a part imports the names it reads from
the parts it needs): base.py, api.py, workers.py, schedule.py, systems.py; env.py parses the variables.
"""

from .api import *  # noqa: F403
from .base import *  # noqa: F403
from .schedule import *  # noqa: F403
from .systems import *  # noqa: F403
from .workers import *  # noqa: F403
