"""The docs site builds with ``mkdocs build --strict`` (warnings are errors), and its quick
start page renders: a headless Chromium screenshot of it, served over HTTP, shows the
theme's header, the text and the reward plot. The concepts page's diagram is a plain SVG
of the repository (docs/img/data_path.svg), which renders offline (no mermaid.js from a
CDN).
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.docs.blocks import ROOT

MKDOCS = Path(sys.executable).parent / "mkdocs"
WIDTH, HEIGHT = 1280, 3000
HEADER = (64, 81, 181)  # the material theme's default (indigo) header bar
CURVE = (31, 119, 180)  # matplotlib's first line colour: the curves of img/reward.png


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", OMP_NUM_THREADS="1")
    build = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, f"mkdocs build --strict failed:\n{build.stderr[-4000:]}"
    warnings = [ln for ln in build.stderr.splitlines() if ln.startswith("WARNING")]
    assert not warnings, "\n".join(warnings)
    return out


def test_every_page_of_the_nav_is_built(site):
    import yaml

    nav = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)["nav"]

    def pages(node) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [p for item in node for p in pages(item)]
        return [p for value in node.values() for p in pages(value)]

    listed = pages(nav)
    on_disk = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(listed) == on_disk, "a page under docs/ is missing from mkdocs.yml's nav"
    for page in listed:
        html = site / ("index.html" if page == "index.md" else f"{page[:-3]}/index.html")
        assert html.exists(), f"{page} was not built"
    api = (site / "api" / "index.html").read_text()
    assert "load_config" in api and "check_env" in api  # mkdocstrings rendered the docstrings
    assert "env.eval_size" in (site / "configs" / "index.html").read_text()


SVG = "{http://www.w3.org/2000/svg}"
STAGES = ("tasks", "Env", "Collector", "Engine (vLLM)", "Buffer", "Trainer", "Megatron-core",
          "Weight sync")  # fmt: skip
INVARIANTS = ("Token in, token out", "Loss mask", "Weight versions", "Nothing lost, nothing twice")


def test_the_concepts_diagram_is_a_local_svg(site):
    import xml.etree.ElementTree as ET

    html = (site / "concepts" / "index.html").read_text()
    img = re.search(r'<img alt="(?P<alt>[^"]*)" src="\.\./img/data_path\.svg"', html)
    assert img, "docs/concepts.md does not show img/data_path.svg"
    assert len(img.group("alt")) > 40, "the diagram needs an alt text that says what it shows"
    for page in site.rglob("*.html"):
        assert "mermaid" not in page.read_text(), f"{page}: mermaid needs mermaid.js from a CDN"
    source = (site / "img" / "data_path.svg").read_text()
    assert source == (ROOT / "docs" / "img" / "data_path.svg").read_text()
    root = ET.fromstring(source)  # well-formed XML
    assert root.tag == f"{SVG}svg" and root.get("viewBox")
    text = " ".join(" ".join(t.itertext()) for t in root.iter(f"{SVG}text"))
    missing = [name for name in (*STAGES, *INVARIANTS) if name not in text]
    assert not missing, f"the diagram does not name {missing}"
    # Plain SVG: nothing to fetch or run when the page is viewed offline.
    assert not list(root.iter(f"{SVG}script")) and "<script" not in source
    assert not re.search(r"(href|src)=|url\((?!#)|@import|@font-face", source), (
        "the diagram references something outside itself"
    )


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per asset would bury a failure's output


def _serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def _count_colour(pixels, rgb: tuple[int, int, int]) -> int:
    import numpy as np

    return int(np.all(np.abs(pixels - np.array(rgb)) <= 3, axis=-1).sum())


def test_quick_start_screenshot(site, tmp_path):
    from matplotlib.image import imread

    chromium = shutil.which("chromium")
    assert chromium, "chromium is missing: scripts/setup.sh installs it (apt-get install chromium)"
    server, url = _serve(site)
    shot = tmp_path / "quickstart.png"
    try:
        subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
             f"--window-size={WIDTH},{HEIGHT}", f"{url}/quickstart/"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
    finally:
        server.shutdown()
    assert shot.exists() and shot.stat().st_size > 50_000, "the screenshot is missing or tiny"
    pixels = (imread(shot)[:, :, :3] * 255).round().astype(int)
    assert pixels.shape[:2] == (HEIGHT, WIDTH)
    # Not blank: a page of text, a table, code and a plot has many distinct colours and
    # a real share of dark (text) pixels.
    distinct = len({tuple(p) for p in pixels[::4, ::4].reshape(-1, 3).tolist()})
    dark = float((pixels.sum(axis=-1) < 200).mean())
    assert distinct > 200 and dark > 0.005, (distinct, dark)
    assert _count_colour(pixels[:80], HEADER) > 20_000, "no theme header: the CSS did not load"
    # The plot is scaled into the page, so only the curves' cores keep the exact colour.
    assert _count_colour(pixels, CURVE) > 100, "the reward plot is not on the page"
