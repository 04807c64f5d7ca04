"""bench poll-cycle's CPU figures: what /proc says each process used, not what the wall clock saw."""

import os
import subprocess
import sys
import time

from benchmarks.monitoring.poll_fleet import process_cpu_s


def test_a_process_cpu_is_its_user_and_system_time():
    busy = time.process_time() + 0.3
    while time.process_time() < busy:  # use some CPU, so the clock ticks are well above rounding
        pass
    assert abs(process_cpu_s(os.getpid()) - time.process_time()) < 0.05


def test_a_process_waiting_uses_no_cpu_and_a_gone_one_counts_nothing():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.5)
        waited = process_cpu_s(sleeper.pid)
        time.sleep(0.5)
        assert process_cpu_s(sleeper.pid) == waited  # asleep: not a tick more
    finally:
        sleeper.kill()
        sleeper.wait()
    assert process_cpu_s(sleeper.pid) == 0.0
