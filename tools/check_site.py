"""Check the built documentation site as a reader's browser renders it (``make docs-check``).

Serves ``site/`` over HTTP on the loopback interface, opens every page in headless Chromium
(``--dump-dom``: the DOM after the page's scripts ran) and checks that each page

* has a title, and a first heading that is not a "404" page;
* links only to pages and files that exist in the site, and to anchors that exist on them;
* under ``reference/``, renders the module's members, with a signature (mkdocstrings'
  ``doc-signature`` block) for every function and method.

``mkdocs build --strict`` already refuses broken links in the Markdown; this catches what only
the rendered pages show (links written by the theme or by mkdocstrings, an empty API page).
Without Chromium it fails (exit 2) saying how to install it [CHOICE: it used to pass with a
"SKIPPED" line, so CI, which lacked Chromium, never rendered a page; a check that cannot
run is not a check that passed. ``make docs-browser`` installs it where it can].

Usage: ``python tools/check_site.py [SITE_DIR] [--screenshot DIR PAGE ...]``
"""

from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
#: seconds one page may take to load and render
PAGE_TIMEOUT = 60


@dataclass
class Page:
    """What the checks need from one rendered page."""

    title: str = ""
    first_heading: str = ""
    links: list[str] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)
    signatures: int = 0
    #: API objects rendered by mkdocstrings (modules, classes, functions, attributes)
    objects: int = 0
    functions: int = 0


class PageParser(HTMLParser):
    """Collects the title, the first ``h1``, every ``href``, every ``id`` and the signatures."""

    def __init__(self) -> None:
        super().__init__()
        self.page = Page()
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if values.get("id"):
            self.page.ids.add(values["id"])
        if values.get("name") and tag == "a":
            self.page.ids.add(values["name"])
        if tag == "a" and "href" in values:
            self.page.links.append(values["href"])
        classes = values.get("class", "").split()
        self.page.signatures += "doc-signature" in classes
        if "doc-object" in classes:
            self.page.objects += 1
            self.page.functions += "doc-function" in classes
        if tag == "title" or (tag == "h1" and not self.page.first_heading):
            self._in = tag

    def handle_endtag(self, tag: str) -> None:
        if tag == self._in:
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "title":
            self.page.title += data
        elif self._in == "h1":
            self.page.first_heading += data


def find_browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


@contextmanager
def served(site: Path) -> Iterator[str]:
    """``site`` over HTTP on a free loopback port; yields the base URL."""
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def chromium(browser: str, *args: str) -> str:
    """Run headless Chromium with a throw-away profile; its standard output."""
    with tempfile.TemporaryDirectory(prefix="check-site-") as profile:
        command = [
            browser,
            "--headless",
            "--no-sandbox",  # needed as root, harmless otherwise
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={profile}",
            *args,
        ]
        run = subprocess.run(command, capture_output=True, text=True, timeout=PAGE_TIMEOUT)
    if run.returncode != 0:
        raise RuntimeError(f"chromium failed ({run.returncode}): {run.stderr.strip()[-500:]}")
    return run.stdout


def render(browser: str, url: str) -> Page:
    parser = PageParser()
    parser.feed(chromium(browser, "--virtual-time-budget=3000", "--dump-dom", url))
    return parser.page


def internal_target(page: str, href: str) -> tuple[str, str] | None:
    """The site-relative path and the fragment an internal link points to (None: external)."""
    parts = urlsplit(href)
    if parts.scheme or parts.netloc or href.startswith(("mailto:", "javascript:")):
        return None
    if not parts.path:
        return page, unquote(parts.fragment)
    base = PurePosixPath(page).parent
    target = PurePosixPath(*(base / unquote(parts.path)).parts)
    resolved: list[str] = []
    for part in target.parts:
        if part == "..":
            if resolved:
                resolved.pop()
        elif part != ".":
            resolved.append(part)
    path = "/".join(resolved)
    if parts.path.endswith("/") or path == "":
        path = f"{path}/index.html".lstrip("/")
    return path, unquote(parts.fragment)


def check_page(name: str, page: Page, site: Path, pages: dict[str, Page]) -> list[str]:
    problems = []
    if not page.title.strip():
        problems.append("no title")
    if "404" in page.first_heading or "not found" in page.title.lower():
        problems.append(f"renders a 404 page ({page.first_heading.strip()!r})")
    for href in page.links:
        target = internal_target(name, href)
        if target is None:
            continue
        path, fragment = target
        if not (site / path).is_file():
            problems.append(f"broken link {href!r} (no {path} in the site)")
        elif fragment and path in pages and fragment not in pages[path].ids:
            problems.append(f"broken anchor {href!r} (no id {fragment!r} on {path})")
    if name.startswith("reference/"):
        if page.objects < 2:  # the module itself and at least one member
            problems.append("an API reference page that renders no members")
        if page.signatures < page.functions:
            problems.append(f"{page.functions} functions but {page.signatures} signatures")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", nargs="?", default="site", type=Path)
    parser.add_argument(
        "--screenshot",
        nargs="+",
        metavar=("DIR", "PAGE"),
        help="also save a PNG of each PAGE (site-relative, e.g. index.html) into DIR",
    )
    args = parser.parse_args(argv)
    browser = find_browser()
    if browser is None:
        print(
            f"docs-check: no Chromium found (looked for {', '.join(BROWSERS)}), so no page "
            "can be checked; install it ('make docs-browser' does, as root on Debian: "
            "'apt-get install chromium') and run 'make docs-check' again",
            file=sys.stderr,
        )
        return 2
    found: str = browser
    site: Path = args.site
    if not (site / "index.html").is_file():
        print(f"docs-check: {site}/index.html is missing; run 'make docs' first", file=sys.stderr)
        return 2
    names = sorted(
        p.relative_to(site).as_posix() for p in site.rglob("*.html") if p.name != "404.html"
    )
    with served(site) as base, ThreadPoolExecutor(max_workers=2) as pool:
        rendered = dict(zip(names, pool.map(lambda n: render(found, base + n), names), strict=True))
        for spec in (args.screenshot or [])[1:]:
            out = Path(args.screenshot[0]) / (spec.replace("/", "-").removesuffix(".html") + ".png")
            out.parent.mkdir(parents=True, exist_ok=True)
            chromium(
                browser, f"--screenshot={out.resolve()}", "--window-size=1280,1600", base + spec
            )
            print(f"screenshot: {out}")
    failures = 0
    for name in names:
        page = rendered[name]
        problems = check_page(name, page, site, rendered)
        failures += bool(problems)
        status = "ok" if not problems else "FAIL"
        extra = ""
        if name.startswith("reference/"):
            extra = f", {page.objects} API objects, {page.signatures} signatures"
        print(f"{status:4} {name}: {page.title.strip()!r}, {len(page.links)} links{extra}")
        for problem in dict.fromkeys(problems):  # a link repeated on the page, once
            print(f"       {problem}")
    print(f"docs-check: {len(names)} pages in {browser}, {failures} with problems")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
