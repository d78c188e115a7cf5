"""The headless Chromium of the tests that look at rendered pages (one place for its flags and its viewport).

``needs_chromium`` skips a test (or, as ``pytestmark``, a file) where chromium or chromedriver is missing;
``chromium()`` is a context manager that starts a driver and quits it afterwards; ``start()`` returns one for a
fixture that quits it itself; ``open_page()`` opens a page and waits until it is whole.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

BROWSER, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
AVAILABLE = bool(BROWSER and DRIVER)
needs_chromium = pytest.mark.skipif(not AVAILABLE, reason="needs chromium and chromedriver (scripts/setup.sh)")
#: the width reviewers read the pages at, and a laptop screen's height
WIDTH, HEIGHT = 1400, 900


def start(width: int = WIDTH, height: int = HEIGHT, *, window: bool = False, console_log: bool = False):
    """A headless Chromium driver whose viewport is ``width`` x ``height`` (set through the DevTools protocol, so
    the page itself has that room); ``window=True`` sizes the window instead (what a screenshot or the lab sees,
    frame included). ``console_log`` keeps the page's console for ``driver.get_log("browser")``. Chromium's
    scratch files (its singleton socket's folder, which it leaves in the temporary folder when the driver stops it)
    go to a folder of its own, removed when the driver quits."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    scratch = tempfile.mkdtemp(prefix="driftscope-chromium-")

    class Chrome(webdriver.Chrome):
        def quit(self) -> None:
            try:
                super().quit()
            finally:
                shutil.rmtree(scratch, ignore_errors=True)

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    if window:
        options.add_argument(f"--window-size={width},{height}")
    options.binary_location = BROWSER
    if console_log:
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        driver = Chrome(service=Service(DRIVER, env={**os.environ, "TMPDIR": scratch}), options=options)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    if not window:
        try:
            driver.execute_cdp_cmd(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            )
        except BaseException:
            driver.quit()
            raise
    return driver


@contextmanager
def chromium(width: int = WIDTH, height: int = HEIGHT, *, window: bool = False, console_log: bool = False) -> Iterator:
    """``start(...)``'s driver, quit when the block ends (whether it passed or failed)."""
    driver = start(width, height, window=window, console_log=console_log)
    try:
        yield driver
    finally:
        driver.quit()


def open_page(driver, uri: str, ready: str = "true", timeout: float = 60) -> None:
    """Open ``uri`` and wait until it is the loaded document and the JavaScript expression ``ready`` holds.

    ``driver.get`` alone can return before a large page (a notebook's HTML, megabytes of inlined figures) is the
    document: on a busy machine a script run right after it found no images on a page that has two."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(uri)
    script = f"return document.URL === new URL({uri!r}).href && document.readyState === 'complete' && !!({ready});"
    WebDriverWait(driver, timeout).until(lambda d: d.execute_script(script))
