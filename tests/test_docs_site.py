"""The docs site as a reader sees it: built strictly, served over HTTP and rendered by
headless Chromium, whose DOM (`--dump-dom`) must show the API signatures, a navigation
that lists every guide, and no raw mkdocstrings output; measured in the browser
(tests/docs_measure.js), the landing page's first screen shows the install line and code
at 1280 and 390 px, and on every page at 1280 px no code block or table is wider than the
column, no identifier in a table breaks inside a word, every copy button copies code to
run (no prompts, no output), and every example page shows its output. Screenshots of the
main pages at both widths are written to $JAXBRIDGE_DOCS_SCREENSHOTS (default: the
test's temporary directory).

Marked `docs`: deselected by default, run by CI's docs stage (`pytest -m docs`) in an
environment with `pip install ".[docs]"` and Debian's `chromium`. A missing tool there
fails the test (a docs stage that skipped itself would hide a broken site).
"""

import functools
import html
import http.server
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.parse
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
    handler = functools.partial(MeasuringHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


# What a reader sees, measured in the page itself: a page asked for with "?measure=KEY"
# gets this script, which posts its findings as JSON back to /__measured?measure=KEY.
MEASURE_JS = (ROOT / "tests" / "docs_measure.js").read_text()


class MeasuringHandler(http.server.SimpleHTTPRequestHandler):
    """The built site, quietly; with MEASURE_JS in each page asked for with "?measure=KEY",
    whose findings it keeps in `reports[KEY]`."""

    reports: dict[str, dict] = {}

    def log_message(self, *args):
        pass

    def do_GET(self):
        path, _, query = self.path.partition("?")
        if path == "/__frame":  # the page at an exact size (a window is at least 500 px)
            ask = urllib.parse.parse_qs(query)
            frame = (f'<iframe src="{html.escape(ask["page"][0])}?measure='
                     f'{urllib.parse.quote(ask["measure"][0])}" width="{int(ask["w"][0])}" '
                     f'height="{int(ask["h"][0])}" style="border: 0"></iframe>')
            return self.reply(f"<!doctype html><body style='margin: 0'>{frame}</body>".encode(),
                              "text/html; charset=utf-8")
        if not query.startswith("measure="):
            return super().do_GET()
        page = Path(self.translate_path(path)) / "index.html"
        body = page.read_text().replace("</body>", f"<script>{MEASURE_JS}</script></body>")
        self.reply(body.encode(), "text/html; charset=utf-8")

    def do_POST(self):
        path, _, query = self.path.partition("?")
        length = int(self.headers.get("Content-Length", 0))
        if path == "/__measured" and query.startswith("measure="):
            key = urllib.parse.unquote(query.removeprefix("measure="))
            self.reports[key] = json.loads(self.rfile.read(length))
        self.reply(b"", "text/plain")

    def reply(self, data: bytes, kind: str):
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def pages() -> list[str]:
    """Every page of the site, as its URL path ("" is the landing page); mkdocs.yml's
    navigation lists them all (the strict build fails otherwise)."""
    import yaml  # mkdocs' own dependency

    class Loader(yaml.SafeLoader):
        pass
    Loader.add_multi_constructor("", lambda loader, suffix, node: None)  # !!python/name tags
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)

    def walk(entry):
        if isinstance(entry, str):
            yield entry
        elif isinstance(entry, dict):
            for value in entry.values():
                yield from walk(value)
        else:
            for item in entry:
                yield from walk(item)
    found = []
    for source in walk(config["nav"]):
        page = source.removesuffix(".md").removesuffix("index")
        found.append(page if page == "" or page.endswith("/") else page + "/")
    return found


@pytest.fixture(scope="module")
def measured(site, chromium, tmp_path_factory):
    """What MEASURE_JS found on a page at a window size (width, height)."""
    folder = tmp_path_factory.mktemp("measured")

    @functools.cache
    def measure(page: str, width: int = 1280, height: int = 800) -> dict:
        key = f"{page or 'home'}@{width}x{height}"
        frame = urllib.parse.urlencode({"page": f"/{page}", "measure": key,
                                         "w": width, "h": height})
        browse(chromium, f"{site}/__frame?{frame}", f"--screenshot={folder / 'page.png'}",
               f"--window-size={width + 100},{height + 100}", "--hide-scrollbars",
               "--virtual-time-budget=10000")
        assert key in MeasuringHandler.reports, f"{key}: the measuring script did not report"
        found = MeasuringHandler.reports[key]
        assert found["width"] == width, f"{key}: laid out at {found['width']} px"
        return found
    return measure


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
    ("api/scipy-integrate/", "jaxbridge.scipy.integrate.solve_ivp", solve_ivp),
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


@pytest.mark.parametrize("page", ["", "api/jaxbridge/", "api/scipy-integrate/", "api/errors/",
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
    for page, name in (("", "home"), ("getting-started/", "getting-started"),
                       ("api/jaxbridge/", "api-jaxbridge"),
                       ("api/scipy-integrate/", "api-scipy-integrate"),
                       ("performance/", "performance"), ("guides/errors/", "errors"),
                       ("guides/reliability/", "reliability"),
                       ("examples/quickstart/", "example-quickstart")):
        for width, height in ((1280, 2000), (390, 1600)):
            path = folder / f"{name}-{width}.png"
            browse(chromium, f"{site}/{page}", f"--screenshot={path}",
                   f"--window-size={width},{height}", "--hide-scrollbars")
            assert path.stat().st_size > 20_000, f"{path}: an empty-looking screenshot"


@pytest.mark.parametrize("width", [1280, 390])
def test_the_first_screen_shows_the_install_line_and_code(measured, width):
    first = measured("", width, 800)
    assert first["install"] is not None, "no install line (.jb-install) on the landing page"
    assert first["install"] <= 800, f"the install line ends at {first['install']} px"
    assert first["code"] is not None and first["code"] < 800 - 60, (
        f"at {width} px the first code block starts at {first['code']} px")


@pytest.mark.parametrize("page", pages())
def test_what_a_reader_sees(measured, page):
    """At 1280 px nothing is cut off at the column's edge, no identifier in a table breaks
    inside a word, and each copy button copies code to run."""
    found = measured(page)
    where = page or "home"
    assert not found["wide"], f"{where}: wider than the content column: {found['wide']}"
    assert not found["broken"], f"{where}: identifiers broken in tables: {found['broken']}"
    assert len(found["copies"]) == found["code_blocks"], (
        f"{where}: {found['code_blocks']} code blocks, {len(found['copies'])} copy buttons")
    for copy in found["copies"]:
        assert not copy["output"], f"{where}: a copy button on output: {copy['text'][:200]}"
        prompts = [line for line in copy["text"].splitlines()
                   if line.startswith((">>>", "... "))]
        assert not prompts, f"{where}: a copy button copies prompts: {prompts}"
        if copy["pycon"]:  # a doctest: what is copied (no prompts, no output) must run
            compile(copy["text"], f"{where} (copied)", "exec")
    if page.startswith("examples/") and page != "examples/":
        assert found["outputs"] and all(o.strip() for o in found["outputs"]), \
            f"{where}: no output shown"
        if page != "examples/cpp_extension/":
            assert found["outputs"][0].strip().splitlines()[-1] == "OK", found["outputs"][0][-300:]


@pytest.mark.parametrize("page", [p for p in pages() if p.startswith("api/")])
def test_names_break_between_their_parts_on_a_phone(measured, page):
    """At 390 px a module's name in its page title ("jaxbridge.scipy.integrate") and the
    names in tables wrap at their dots, not inside a word."""
    found = measured(page, 390, 800)
    assert not found["broken"], f"{page}: names broken inside a word: {found['broken']}"
