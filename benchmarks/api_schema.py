"""`python manage.py bench schemathesis [--examples N] [--seed S] [--coverage] [--persona P] [--operations RE]`:
the schema test, longer and randomised.

`make test` runs tests/api/test_api_schemathesis.py derandomised (a fixed seed, 10 examples per
operation, plus the examples recorded in tests/api/schemathesis-examples/), so the same code always
gives the same result. This runs the same test (every schemathesis check, operator, member and
anonymous) with more examples (and schemathesis' coverage phase with --coverage) and a seed of its own
(random unless given; printed, so a failure can be replayed with --seed), on the configured kind of
database (DATABASE_URL: CI runs it on PostgreSQL), and counts the failing operations by kind (the
failure of each check, 0 included: ServerError, JsonSchemaError, AcceptedNegativeData...) and persona.

The test runs in a pytest subprocess, in pytest's own throwaway database; it reads the committed
example database but never writes to it (recording is GPUAAS_SCHEMATHESIS_RECORD=1, which this never
sets). --persona and --operations run a part of it (some personas, the operations whose label matches a
regular expression), to replay a failure or iterate on a fix quickly. Needs the source checkout: the test
lives in tests/, which the image does not ship.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from django.conf import settings

from .registry import Smoke, arg, benchmark
from .targets import correctness

TEST = Path("tests") / "api" / "test_api_schemathesis.py"
PERSONAS = ("operator", "bob", "anonymous")  # bob: a member of team-a


# The failure of each of schemathesis' checks (4.32: schemathesis.checks.CHECKS), counted even at 0.
KINDS = (
    "ServerError",  # not_a_server_error
    "UndefinedStatusCode",  # status_code_conformance
    "UndefinedContentType",  # content_type_conformance
    "MissingContentType",
    "MalformedMediaType",
    "MissingHeaders",  # response_headers_conformance
    "JsonSchemaError",  # response_schema_conformance
    "AcceptedNegativeData",  # negative_data_rejection
    "RejectedPositiveData",  # positive_data_acceptance
    "MissingHeaderNotRejected",  # missing_required_header
    "UnsupportedMethodResponse",  # unsupported_method
    "AllowHeaderMismatch",  # allow_header_conformance
    "UseAfterFree",  # use_after_free
    "EnsureResourceAvailability",  # ensure_resource_availability
    "IgnoredAuth",  # ignored_auth
    "ObjectLevelAuthorizationViolation",  # object_level_authorization
)


def summarise(lines: list[dict]) -> dict:
    """The report lines the test writes (one per persona) as counts: failing operations by kind (every
    kind, 0 included) and persona."""
    by_kind: Counter[str] = Counter(dict.fromkeys(KINDS, 0))
    by_persona: dict[str, dict[str, int]] = {}
    operations: dict[str, list[str]] = {}
    for line in lines:
        kinds = Counter(dict.fromkeys(KINDS, 0))
        kinds.update(kind for found in line["failures"].values() for kind in found)
        by_kind.update(kinds)
        by_persona[line["persona"]] = dict(sorted(kinds.items()))
        for label in line["failures"]:
            operations.setdefault(label, []).append(line["persona"])
    return {
        "failures": sum(len(line["failures"]) for line in lines),
        "failures_by_kind": dict(sorted(by_kind.items())),
        "failures_by_persona": by_persona,
        "failing_operations": dict(sorted(operations.items())),
    }


@benchmark(
    "schemathesis",
    "Schemathesis over every API operation with more examples and a random (or given) seed",
    [
        arg("--examples", type=int, default=100, help="examples per operation and persona (make test: 10)"),
        arg("--seed", type=int, default=None, help="Hypothesis seed (default: random, printed)"),
        arg(
            "--coverage",
            action="store_true",
            help="schemathesis' coverage phase too (about 6,000 fixed cases per persona, sent before fuzzing)",
        ),
        arg(
            "--persona",
            action="append",
            choices=PERSONAS,
            default=None,
            help="only this persona (repeat for several; default: all three; bob is a member of team-a)",
        ),
        arg(
            "--operations",
            default="",
            help="only the operations whose label matches this regular expression (e.g. 'POST /api/v1/tokens/')",
        ),
    ],
    targets=[correctness("failures", "==", 0)],
    smoke=Smoke(skip="make test runs the same test derandomised (tests/api/test_api_schemathesis.py)"),
)
def run(
    *,
    examples: int,
    seed: int | None,
    coverage: bool = False,
    persona: list[str] | None = None,
    operations: str = "",
    stdout=None,
    **_,
) -> dict:
    if examples < 1:
        raise SystemExit("--examples must be at least 1")
    try:
        re.compile(operations)
    except re.error as exc:
        raise SystemExit(f"--operations is not a regular expression: {exc}") from None
    personas = [name for name in PERSONAS if name in (persona or PERSONAS)]
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
    base = Path(settings.BASE_DIR)
    if not (base / TEST).exists():
        raise SystemExit(f"bench schemathesis needs {TEST}: run it from a source checkout")
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.jsonl"
        env = {
            **os.environ,
            "GPUAAS_SCHEMATHESIS_EXAMPLES": str(examples),
            "GPUAAS_SCHEMATHESIS_SEED": str(seed),
            "GPUAAS_SCHEMATHESIS_REPORT": str(report),
            "GPUAAS_SCHEMATHESIS_COVERAGE": "1" if coverage else "0",
            "GPUAAS_SCHEMATHESIS_PERSONAS": ",".join(personas),
            "GPUAAS_SCHEMATHESIS_ONLY": operations,
        }
        env.pop("GPUAAS_SCHEMATHESIS_RECORD", None)  # the committed example database stays as committed
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "pytest", str(TEST)],
            cwd=base,
            env=env,
            capture_output=True,
            text=True,
        )
        seconds = round(time.monotonic() - started, 1)
        lines = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    if len(lines) < len(personas):  # one per persona: the run broke before checking (a collection or fixture error)
        exit_code = done.returncode
        raise RuntimeError(f"the schemathesis test did not report (pytest exit {exit_code}):\n{done.stdout[-4000:]}")
    summary = summarise(lines)
    if stdout is not None and summary["failures"]:
        for line in lines:
            for message in line.get("messages", []):
                stdout.write(f"[{line['persona']}] {message}\n\n")
    return {
        "benchmark": "schemathesis",
        "database": lines[0]["database"],
        "examples": examples,
        "coverage": coverage,
        "seed": seed,
        "personas": personas,
        "only": operations or None,
        "operations": lines[0]["operations"],
        "cases": {line["persona"]: line["cases"] for line in lines},
        **summary,
        "seconds": seconds,
    }
