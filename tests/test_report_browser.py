"""The report as a reader sees it (issue 51): headless Chromium opens report.html at 1,400 x 1,000 pixels, as
scripts/browser_check.py opens JupyterLab, and checks that the verdicts are visible at a glance: the summary table
fits the window (its notes moved below it, in a list), each paper's forest plot is on the page before the first
paper's section and has loaded, and a screenshot of the top of the page is not blank. Skips where Chromium,
chromedriver or Selenium is missing, except in CI (CI=true), whose setup installs them: there it fails."""
from __future__ import annotations

import importlib.util
import os
import shutil

import pytest
import yaml

from pflrepro.reporting import replication
from tests.test_replication import tree  # noqa: F401  (the fixture: a hand-made results tree)

WIDTH, HEIGHT = 1400, 1000


@pytest.fixture
def chromium():
    missing = [n for n in ("chromium", "chromedriver") if shutil.which(n) is None]
    if importlib.util.find_spec("selenium") is None:
        missing.append("selenium")
    if missing and os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but the report's browser check needs {', '.join(missing)} (scripts/setup.sh installs them)",
                    pytrace=False)
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run",
                f"--window-size={WIDTH},{HEIGHT}", "--disable-extensions", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=shutil.which("chromedriver")))
    try:
        yield driver
    finally:
        driver.quit()


PAGE_JS = r"""
const summary = [...document.querySelectorAll('table')].find(t => t.innerText.includes('independent tests decided'));
const forests = [...document.querySelectorAll('img')].filter(i => (i.alt || '').endsWith(': claims'));
const first = document.getElementById('paper-fake');
return {width: window.innerWidth,
        summaryRight: summary ? summary.getBoundingClientRect().right : null,
        summaryCells: summary ? summary.rows[0].cells.length : 0,
        longestCell: summary ? Math.max(...[...summary.querySelectorAll('td')].map(td => td.innerText.length)) : 0,
        forests: forests.map(i => [i.naturalWidth, i.naturalHeight, first ? (i.compareDocumentPosition(first) & 4) > 0 : false]),
        firstForestTop: forests.length ? forests[0].getBoundingClientRect().top + window.scrollY : null,
        notes: [...document.querySelectorAll('li')].some(li => li.innerText.includes('Method two needs ten times'))};
"""


def test_report_opens_with_its_verdicts_at_a_glance(tree, chromium, tmp_path):  # noqa: F811
    results, figures, _ = tree
    from pflrepro.reporting import claims
    path = claims.loading.CLAIMS_DIR / "fake_claims.yaml"   # the fake paper's files (the `tree` fixture points it there)
    doc = yaml.safe_load(path.read_text())
    doc["scale_notes"]["mini"] = "Method two needs ten times the data. " + "More on the scale of this profile. " * 12
    path.write_text(yaml.safe_dump(doc))
    out = replication.write_report(results, figures, results / "report")
    chromium.get(out["html"].resolve().as_uri())
    page = chromium.execute_script(PAGE_JS)
    assert page["summaryRight"] is not None and page["summaryRight"] <= page["width"], page   # fits 1,400 px
    assert page["longestCell"] < 60, page                       # counts and names in the cells, no paragraphs
    assert page["notes"], "the profile's note is not listed under the summary"
    assert page["forests"] and all(w > 0 and h > 0 and before for w, h, before in page["forests"]), page
    assert page["firstForestTop"] < 2 * HEIGHT, page            # right after the summary: within two screens
    shot = tmp_path / "report.png"
    assert chromium.save_screenshot(str(shot))
    from PIL import Image
    img = Image.open(shot).convert("L")
    assert img.size[0] >= WIDTH - 20 and len(set(img.getdata())) > 20     # something drawn, not a blank page
