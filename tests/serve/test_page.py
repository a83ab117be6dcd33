"""The web page in headless Chromium (Debian's chromium + chromedriver, `make browser`):
paste a passage, ask, find the answer highlighted in it, and keep a screenshot."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.serve.conftest import Service

pytestmark = [pytest.mark.integration, pytest.mark.trains]

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        if os.environ.get("CI"):  # CI installs it (`make browser`): missing there is a failure
            pytest.fail(f"{CHROMIUM} or {CHROMEDRIVER} missing; run `make browser`")
        pytest.skip("no chromium here; `make browser` installs Debian's")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService

    profile = tempfile.mkdtemp(prefix="rcpipe-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 f"--user-data-dir={profile}", "--window-size=1200,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=DriverService(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_the_page_highlights_the_answer_in_the_passage(
        service: Service, browser, tmp_path_factory: pytest.TempPathFactory) -> None:  # noqa: ANN001
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    qid = next(iter(service.questions))
    context, question = service.contexts[qid], service.questions[qid]
    want = service.nbest["bidaf"][qid]["text"]
    wait = WebDriverWait(browser, 30)

    browser.get(service.url + "/")
    wait.until(lambda d: len(Select(d.find_element(By.ID, "model")).options) == 3)
    Select(browser.find_element(By.ID, "model")).select_by_value("bidaf")
    # a person pastes the passage: the whole text lands at once
    browser.execute_script("arguments[0].value = arguments[1]",
                           browser.find_element(By.ID, "context"), context)
    browser.find_element(By.ID, "question").send_keys(question)
    browser.find_element(By.ID, "ask").click()
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state")
               in ("answered", "error"))
    assert browser.find_element(By.ID, "error").text == ""

    marks = browser.find_elements(By.CSS_SELECTOR, "#passage mark.answer")
    assert len(marks) == 1 and marks[0].text == want != ""
    assert browser.find_element(By.ID, "answer-text").text == want
    assert browser.find_element(By.ID, "passage").text.split() == context.split()
    tokens = browser.find_elements(By.CSS_SELECTOR, "#passage .tok")
    shading = browser.execute_script(
        "return [...document.querySelectorAll('#passage .tok')]"
        ".map(t => parseFloat(t.style.getPropertyValue('--ps')))")
    assert len(shading) == len(tokens) and max(shading) == 1.0  # the likeliest start: darkest
    assert len(browser.find_elements(By.CSS_SELECTOR, "#chart .col")) == len(tokens)

    shot = tmp_path_factory.mktemp("page") / "serve-page.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")

    # an error is shown on the page, not swallowed
    browser.find_element(By.ID, "question").clear()
    browser.find_element(By.ID, "ask").click()
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state")
               == "error")
    assert "422: question is empty" in browser.find_element(By.ID, "error").text
