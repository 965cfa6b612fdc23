"""The chat page in headless Chromium: type a message, see the streamed reply, stop one."""

from __future__ import annotations

import os
import shutil

import pytest

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

pytestmark = pytest.mark.skipif(not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)),
                                reason="needs Debian chromium + chromium-driver")


@pytest.fixture(scope="module")
def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-dev-shm-usage"):
        opts.add_argument(flag)
    drv = webdriver.Chrome(service=webdriver.ChromeService(executable_path=DRIVER), options=opts)
    yield drv
    drv.quit()


def test_types_message_and_sees_streamed_reply(browser, fake_live):
    browser.get(fake_live.url + "/")
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "model").text == "fake-model")
    box = browser.find_element(By.ID, "input")
    box.send_keys("SAY: Hi from **chromium** and `code`")
    browser.find_element(By.ID, "send").click()
    reply = WebDriverWait(browser, 20).until(
        lambda d: next((e for e in d.find_elements(By.CSS_SELECTOR, ".msg.assistant") if e.get_attribute("data-state") == "done"), None))
    assert reply.text == "Hi from chromium and code"
    assert reply.find_element(By.TAG_NAME, "strong").text == "chromium"  # markdown rendered
    assert browser.find_elements(By.CSS_SELECTOR, ".msg.user")[-1].text.startswith("SAY: Hi")


def test_stop_button_cancels_stream(browser, fake_live):
    fake_live.engine.token_delay_s = 0.2
    browser.get(fake_live.url + "/")
    browser.find_element(By.ID, "input").send_keys("tell me a long story")
    browser.find_element(By.ID, "send").click()
    WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1].text)
    browser.find_element(By.ID, "stop").click()
    WebDriverWait(browser, 10).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1].get_attribute("data-state") == "done")
    WebDriverWait(browser, 10).until(lambda d: fake_live.engine.stats()["num_running"] == 0)
    assert fake_live.engine.stats()["kv_blocks_free"] == fake_live.engine.total_blocks
