"""The docs site as a reader sees it: built strictly, served over HTTP and rendered by
headless Chromium, whose DOM (`--dump-dom`) must show the API signatures, a navigation
that lists every guide, and no raw mkdocstrings output. Screenshots of the pages are
written to $JAXBRIDGE_DOCS_SCREENSHOTS (default: the test's temporary directory).

Marked `docs`: deselected by default, run by CI's docs stage (`pytest -m docs`) in an
environment with `pip install ".[docs]"` and Debian's `chromium`. A missing tool there
fails the test (a docs stage that skipped itself would hide a broken site).
"""

import functools
import html
import http.server
import inspect
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import jaxbridge as jb
from jaxbridge.scipy.integrate import solve_ivp

pytestmark = pytest.mark.docs
ROOT = Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Build the site with `mkdocs build --strict` and serve it on a free local port."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                            "--site-dir", str(out)], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=600)
    assert build.returncode == 0, f"mkdocs build --strict failed:\n{build.stdout}{build.stderr}"
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


@pytest.fixture(scope="module")
def chromium():
    found = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if found is None:
        pytest.fail(f"no headless browser ({', '.join(BROWSERS)}): apt-get install chromium")
    return found


def browse(chromium: str, url: str, *flags: str) -> str:
    # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start
    run = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                          "--disable-dev-shm-usage", *flags, url],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, f"chromium failed on {url}:\n{run.stderr[-3000:]}"
    return run.stdout


@pytest.fixture(scope="module")
def dom(site, chromium):
    return functools.cache(lambda page: browse(chromium, f"{site}/{page}", "--dump-dom"))


def text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def signature(page_dom: str, identifier: str) -> str:
    """The rendered signature of `identifier` (mkdocstrings' heading id), as text."""
    at = page_dom.find(f'id="{identifier}"')
    assert at >= 0, f"no heading for {identifier} on the page"
    match = re.search(r'<div class="doc-signature[^"]*">(.*?)</div>', page_dom[at:], re.DOTALL)
    assert match, f"no signature block after the heading of {identifier}"
    return " ".join(text(match.group(1)).split())


@pytest.mark.parametrize("page, identifier, function", [
    ("api/jaxbridge/", "jaxbridge.foreign", jb.foreign),
    ("api/jaxbridge/", "jaxbridge.kernel", jb.kernel),
    ("api/scipy/", "jaxbridge.scipy.integrate.solve_ivp", solve_ivp),
])
def test_the_api_pages_show_the_signatures(dom, page, identifier, function):
    shown = signature(dom(page), identifier)
    name = identifier.rsplit(".", 1)[1]
    assert shown.startswith(f"{name}("), shown
    for parameter in inspect.signature(function).parameters.values():
        assert re.search(rf"\b{parameter.name}\b", shown), \
            f"{identifier}: parameter {parameter.name!r} is not in the rendered {shown!r}"
    assert "->" in shown  # return annotations are shown


def test_the_navigation_lists_every_guide(dom):
    home = dom("")
    start = home.find('class="md-nav md-nav--primary"')  # the site navigation (left)
    assert start >= 0, "no primary navigation in the page"
    nav = home[start:home.find('class="md-content"', start)]
    guides = sorted(p.stem for p in (ROOT / "docs" / "guides").glob("*.md"))
    assert len(guides) >= 5
    missing = [g for g in guides if f'href="guides/{g}/"' not in nav]
    assert not missing, f"guides missing from the navigation: {missing}"
    for page in ("getting-started/", "performance/", "api/"):
        assert f'href="{page}' in nav


@pytest.mark.parametrize("page", ["", "api/jaxbridge/", "api/scipy/", "api/errors/",
                                  "api/testing/", "performance/"])
def test_no_raw_mkdocstrings_output(dom, page):
    shown = text(dom(page))
    for raw in (":::", "Could not collect", "could not find",
                "mkdocstrings", ":func:", ":class:"):
        assert raw not in shown, f"{page or 'home'}: raw {raw!r} in the rendered page"
    if page == "performance/":  # the plots are there and load
        assert shown.count("|---") == 0  # tables rendered, not shown as Markdown
        assert len(re.findall(r'<img [^>]*src="[^"]*assets/performance/\w+\.png"', dom(page))) == 4


def test_screenshots(site, chromium, tmp_path):
    folder = Path(os.environ.get("JAXBRIDGE_DOCS_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    for page, name in (("", "home"), ("api/jaxbridge/", "api-jaxbridge"),
                       ("api/scipy/", "api-scipy"), ("performance/", "performance")):
        path = folder / f"{name}.png"
        browse(chromium, f"{site}/{page}", f"--screenshot={path}", "--window-size=1280,2000",
               "--hide-scrollbars")
        assert path.stat().st_size > 20_000, f"{path}: an empty-looking screenshot"
