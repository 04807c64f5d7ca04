"""Browser tests: Playwright driving Debian's Chromium (/usr/bin/chromium) against pytest-django's live_server.

Skipped when Chromium or the playwright package is missing, unless GPUAAS_REQUIRE_SERVICES=1 (CI),
where a missing browser is an error. Any JavaScript console error or page error fails the test.
Screenshots go to artifacts/screenshots/ (gitignored).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("GPUAAS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
WIDE, NARROW = 1280, 420

# The dashboard tests' small world, shared (tests/dashboard/dashboard_world.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dashboard"))


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install playwright)"
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} is missing (apt-get install chromium)"
    return None


def pytest_collection_modifyitems(config, items):
    browser_items = [item for item in items if "browser" in item.keywords]
    reason = _missing() if browser_items else None
    if reason is None:
        return
    if os.environ.get("GPUAAS_REQUIRE_SERVICES") == "1":
        raise pytest.UsageError(f"GPUAAS_REQUIRE_SERVICES=1 but browser tests cannot run: {reason}")
    for item in browser_items:
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="module")
def chromium(django_db_setup):
    """One headless Chromium per test module.

    Playwright's sync API keeps an asyncio loop running in this thread while it is started, which
    Django's async-safety guard takes for an async context; the ORM calls these tests make are plain
    synchronous calls, so the guard is lifted exactly while Playwright runs (and the test database
    is set up before it starts).
    """
    from django.db import connections
    from playwright.sync_api import sync_playwright

    # Django keeps connections per context; with the loop running the tests get a fresh connection
    # object, which must carry the serialized test database for serialized_rollback to reload it.
    serialized = {alias: getattr(connections[alias], "_test_serialized_contents", None) for alias in connections}
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as p:
            for alias, contents in serialized.items():
                if contents is not None:
                    connections[alias]._test_serialized_contents = contents
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield browser
            browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


class Page:
    """A Playwright page that records console errors and page errors, and takes screenshots."""

    def __init__(self, page, base_url: str):
        self.page = page
        self.base_url = base_url
        self.errors: list[str] = []
        page.on(
            "console",
            lambda msg: msg.type == "error" and self.errors.append(f"console: {msg.text} ({msg.location.get('url')})"),
        )
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))

    def __getattr__(self, name):
        return getattr(self.page, name)

    def go(self, path: str):
        response = self.page.goto(self.base_url + path)
        assert response is not None and response.ok, (path, response and response.status)
        return response

    def login(self, username: str, password: str, *, admin: bool):
        """Sign in through the admin login (operators) or /accounts/login/ (members)."""
        self.go("/admin/login/" if admin else "/accounts/login/")
        self.page.fill("input[name=username]", username)
        self.page.fill("input[name=password]", password)
        self.page.click("[type=submit]")
        self.page.wait_for_load_state()

    def set_width(self, width: int) -> None:
        """Resize the window and let the layout settle (charts resize on the next animation frames)."""
        self.page.set_viewport_size({"width": width, "height": 900})
        self.page.evaluate("new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))")
        self.page.wait_for_timeout(200)

    def shoot(self, name: str) -> list[Path]:
        """Full-page screenshots at 1280 px and 420 px wide, each checked for sideways overflow."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        paths = []
        for width in (WIDE, NARROW):
            self.set_width(width)
            path = SCREENSHOTS / f"{name}-{width}.png"
            self.page.screenshot(path=str(path), full_page=True)
            assert self.horizontal_overflow() == 0, f"{name} scrolls sideways at {width} px"
            paths.append(path)
        self.set_width(WIDE)
        return paths

    def horizontal_overflow(self) -> int:
        """How many pixels the page is wider than the window (0 = nothing to scroll sideways)."""
        return self.page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")


@pytest.fixture
def browser_page(chromium, live_server):
    context = chromium.new_context(viewport={"width": WIDE, "height": 900})
    page = Page(context.new_page(), live_server.url)
    yield page
    context.close()
    assert page.errors == [], page.errors


@pytest.fixture
def page_class():
    """The Page wrapper itself, for a test that opens several pages: a test module cannot import it from
    `conftest` by name (several test folders have a conftest module, and the first one imported wins)."""
    return Page
