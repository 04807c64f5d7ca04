"""Settings for the beat switchover test (test_beat_standby.py): the suite's settings, with Redis.

One short schedule entry every BEAT_SWITCHOVER_PERIOD_S seconds on its own queue, and the loop interval
and lock timeout that gpuaas.settings.beat_takeover derives from it, exactly as production derives them
from the real schedule. The scheduler itself is chosen by gpuaas.settings (redbeat, since the broker is Redis).
"""

import os

from gpuaas.settings import beat_takeover, every
from gpuaas.settings_test import *  # noqa: F403

SWITCHOVER_TICK = "tests.foundation.beat_switchover_tasks.switchover_tick"
SWITCHOVER_QUEUE = "beat-switchover"
SWITCHOVER_PERIOD_S = int(os.environ["BEAT_SWITCHOVER_PERIOD_S"])

_tick = every(SWITCHOVER_PERIOD_S, SWITCHOVER_TICK)
_tick["options"]["queue"] = SWITCHOVER_QUEUE
CELERY_BEAT_SCHEDULE = {"switchover-tick": _tick}
CELERY_BEAT_MAX_LOOP_INTERVAL, REDBEAT_LOCK_TIMEOUT = beat_takeover(CELERY_BEAT_SCHEDULE)
# Apart from any other beat on this Redis database: the test deletes these keys before and after.
REDBEAT_KEY_PREFIX = "beat-switchover-test"
CELERY_IMPORTS = [*CELERY_IMPORTS, "tests.foundation.beat_switchover_tasks"]  # noqa: F405
