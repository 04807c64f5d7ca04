"""Billing settings are parsed strictly: junk stops start-up with one line naming the variable."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _check(**env):
    full = {k: v for k, v in os.environ.items() if not k.startswith("BILLING_")}
    full.update(env)
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'gpuaas.settings');"
            "from django.conf import settings; print(sorted(settings.BILLING_DEFAULT_GPU_HOURLY.items()),"
            " settings.BILLING_CURRENCY)",
        ],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"BILLING_CURRENCY": "euro"}, "BILLING_CURRENCY='EURO' is not an ISO 4217 code"),
        ({"BILLING_DEFAULT_GPU_HOURLY": "H100-80GB=cheap"}, "BILLING_DEFAULT_GPU_HOURLY: 'H100-80GB=cheap'"),
        ({"BILLING_DEFAULT_GPU_HOURLY": "H100-80GB=-1"}, "is not PRODUCT=PRICE"),
        ({"BILLING_METER_INTERVAL_S": "10"}, "BILLING_METER_INTERVAL_S=10 must be at least 60"),
    ],
)
def test_bad_billing_settings_stop_start_up(env, needle):
    result = _check(**env)
    assert result.returncode != 0
    assert needle in result.stderr.strip().splitlines()[-1]


def test_prices_and_currency_from_the_environment():
    result = _check(BILLING_DEFAULT_GPU_HOURLY="H100-80GB=2.75, L40S=1.10", BILLING_CURRENCY="usd")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[('H100-80GB', Decimal('2.75')), ('L40S', Decimal('1.10'))] USD"
