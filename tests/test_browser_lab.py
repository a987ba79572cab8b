"""The notebooks as an attendee sees them: JupyterLab in Debian's Chromium, each notebook run with Run > Run All Cells.

- The notebooks are copies (helpers/lab/workspace.py ``sync`` into a temporary workspace): the committed ones are
  never modified. JupyterLab gets the settings ``workshop lab`` gives it, a free loopback port and a token of its own
  (tests/browser_lab.py); its kernels reach the suite's shared engine (tests/conftest.py), so no extra vLLM starts.
- Each notebook must run to the end with no error output, no stderr output, no SEVERE entry in the browser's
  console, and show what ``MUST_RENDER`` lists for it; then ``INTERACTIONS`` do what an attendee does (02: change the
  explorer's weight dtype, and its figure must redraw).
- A first notebook made to fail (a raised error, a stderr line, a console error) checks that these checks see
  each of them; it is then closed and deleted, so the screenshots show the lab an attendee has.
- Screenshots, top to bottom, go into the test's folder and into build/browser/ for a developer to look at.

Chromium missing: in CI (``CI`` set) the tests fail; elsewhere they skip with the line that installs it.
Extending: a notebook added to ``NOTEBOOKS`` runs too; a new picture or a collapsed solution is one more
``MustRender`` row (a collapsed input shows as ``.jp-InputPlaceholder``; a picture as ``img`` in its cell's output).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

import browser_lab
from browser_lab import STDERR_OUTPUTS, LabPage, LabServer, saved_errors
from helpers.lab.notebooks import REPO_ROOT
from helpers.lab.workspace import sync

pytestmark = pytest.mark.engine
NOTEBOOKS = ("start_here.ipynb", "01_connect_and_first_agent.ipynb", "02_units_and_memory_budget.ipynb")
SHOTS = REPO_ROOT / "build" / "browser"  # the latest run's screenshots, for a developer
RUN_TIMEOUT_S = 300  # one notebook's Run All, the engine already up
PROBE = "zz_browser_checks.ipynb"  # the notebook made to fail: it runs first, in the same lab


@dataclass(frozen=True)
class MustRender:
    """Something a notebook must show after Run All: ``at_least`` elements matching ``selector`` in the notebook."""

    what: str  # in words, for the failure message
    selector: str  # CSS, inside the visible notebook
    at_least: int = 1


EXPLORER = ".widget-interact"  # ipywidgets.interact's box: 02's explorer
MUST_RENDER: dict[str, list[MustRender]] = {
    "start_here.ipynb": [MustRender("the engine's status table", ".jp-OutputArea-output table")],
    "01_connect_and_first_agent.ipynb": [
        MustRender("the streamed request's token timeline and one request's life (the course's first picture), as "
                   "images", ".jp-OutputArea-output img[src^='data:image/png']", 2),
        MustRender("the settings and the rent-or-own costs, as tables", ".jp-OutputArea-output table", 2),
    ],
    "02_units_and_memory_budget.ipynb": [
        MustRender("the explorer's four dropdowns (model, GPU, weight dtype, KV cache dtype)",
                   f"{EXPLORER} .widget-dropdown select", 4),
        MustRender("the explorer's two sliders (--gpu-memory-utilization, --max-model-len)",
                   f"{EXPLORER} .widget-slider", 2),
        MustRender("the explorer's figure, as an image", f"{EXPLORER} .widget-output img"),
        MustRender("matplotlib figures as images (section 2's memory budget and the explorer's)",
                   ".jp-OutputArea-output img[src^='data:image/png']", 2),
    ],
}


def explorer_image(page: LabPage) -> str:
    """The explorer figure's image data ('' when it shows none)."""
    return page.js(f"const i = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) {EXPLORER} "
                   ".widget-output img'); return i ? i.src : ''")


def change_the_explorer_weight_dtype(page: LabPage, shots: Path) -> list[str]:
    """Pick fp8 weights in 02's explorer, as an attendee does; its figure must redraw. Problems seen, in words."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    page.element_screenshot(EXPLORER, shots / "02_explorer_bf16.png")
    before = explorer_image(page)
    boxes = [box for box in page.driver.find_elements(By.CSS_SELECTOR, f"{EXPLORER} .widget-dropdown")
             if box.text.strip().startswith("weight dtype")]
    if not boxes:
        return ["the explorer has no 'weight dtype' dropdown"]
    Select(boxes[0].find_element(By.TAG_NAME, "select")).select_by_visible_text("fp8")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and explorer_image(page) in ("", before):
        time.sleep(0.5)
    page.element_screenshot(EXPLORER, shots / "02_explorer_fp8.png")
    return [] if explorer_image(page) not in ("", before) else ["the explorer's figure did not redraw within 30 s "
                                                               "of choosing fp8 weights"]


INTERACTIONS: dict[str, list[Callable[[LabPage, Path], list[str]]]] = {
    "02_units_and_memory_budget.ipynb": [change_the_explorer_weight_dtype],
}


def write_probe(workspace: Path) -> None:
    """A notebook that fails three ways: a stderr line, a console error from the page, then a raised error."""
    cells = ["import sys\nprint('probe on stderr', file=sys.stderr)",
             "from IPython.display import Javascript, display\n"
             "display(Javascript(\"console.error('probe in the console')\"))",
             "1 / 0",
             "print('never runs')"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, workspace / PROBE)


@pytest.fixture(scope="module")
def page(shared_engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabPage]:
    """Chromium on a JupyterLab of copies of the notebooks, its kernels on the shared engine (started first)."""
    problem = browser_lab.missing()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"{problem} (.ci/run installs it; in CI this test never skips)")
        pytest.skip(problem)
    home = tmp_path_factory.mktemp("browser-lab")
    workspace = home / "notebooks"
    sync(workspace)
    write_probe(workspace)
    shutil.rmtree(SHOTS, ignore_errors=True)  # no screenshot of an earlier run left beside this run's
    with shared_engine.use():  # the engine is up before any notebook runs; the kernels inherit its environment
        server = LabServer(workspace, home)
        browser = None
        try:
            server.wait_ready()
            browser = LabPage(server, home / "chromium-profile")
            yield browser
        finally:
            if browser is not None:
                browser.quit()
            server.stop()


@dataclass
class Seen:
    """What a notebook shows after its run: its saved error outputs, what its cells (widgets' outputs included) wrote
    to stderr, the console's SEVERE entries since it opened, and its input prompts."""

    errors: list[str]
    stderr: list[str]
    console: list[str]
    prompts: list[str]


def look(page: LabPage, notebook: str, console: list[str]) -> Seen:
    """Save the notebook (File > Save Notebook) and read what it shows; ``console``: SEVERE entries seen so far."""
    errors = saved_errors(page.save(notebook))
    console = console + [e.get("message", "")[:500] for e in page.console_entries() if e.get("level") == "SEVERE"]
    return Seen(errors, page.texts(STDERR_OUTPUTS), console, page.cell_prompts())


def run_in_browser(page: LabPage, notebook: str) -> float:
    """Open ``notebook`` and Run All; the seconds the run took."""
    page.console_entries()  # what came before this notebook is not its
    page.open(notebook)
    return page.run_all(notebook, RUN_TIMEOUT_S)


def test_the_checks_see_a_raised_error_a_stderr_line_and_a_console_error(page):
    run_in_browser(page, PROBE)
    seen = look(page, PROBE, [])
    page.forget(PROBE)  # gone before the notebooks run: their screenshots show the lab an attendee has
    assert seen.errors == ["cell 2: ZeroDivisionError: division by zero"], seen.errors
    assert any("probe on stderr" in text for text in seen.stderr), seen.stderr
    assert any("probe in the console" in message for message in seen.console), seen.console
    assert seen.prompts[:3] == ["[1]:", "[2]:", "[3]:"] and not seen.prompts[3][1:-2].strip(), seen.prompts


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_the_notebook_runs_to_the_end_in_chromium_and_shows_what_it_must(page, notebook, tmp_path):
    seconds = run_in_browser(page, notebook)
    console = [e.get("message", "")[:500] for e in page.console_entries() if e.get("level") == "SEVERE"]
    missing = [f"{item.what}: {page.count(item.selector)} shown, at least {item.at_least} expected ({item.selector})"
               for item in MUST_RENDER.get(notebook, []) if page.count(item.selector) < item.at_least]
    for interaction in INTERACTIONS.get(notebook, []):
        missing += interaction(page, tmp_path)
    shots = page.screenshots(tmp_path, Path(notebook).stem)
    seen = look(page, notebook, console)  # after the interactions: their outputs and console entries count too
    shutil.copyfile(page.server.workspace / notebook, tmp_path / notebook)  # as run, outputs and all
    browser_lab.copy_shots([*sorted(tmp_path.glob("*.png")), tmp_path / notebook], SHOTS)
    print(f"{notebook}: Run All took {seconds:.1f} s; {len(shots)} screenshots in {tmp_path} and build/browser/")
    assert not seen.errors, f"{notebook}: a cell failed in the browser: {seen.errors}"
    assert not seen.stderr, f"{notebook}: cells wrote to stderr: {seen.stderr}"
    assert not seen.console, f"{notebook}: browser console errors: {seen.console}"
    # a collapsed cell (a worked solution: metadata jupyter.source_hidden) shows no prompt; the notebook as saved says
    # whether it ran
    saved = [c for c in nbformat.read(tmp_path / notebook, as_version=4).cells if c.cell_type == "code"]
    collapsed = [c for c in saved if c.metadata.get("jupyter", {}).get("source_hidden")]
    shown = [p for p in seen.prompts if p]
    ran = (bool(seen.prompts) and len(shown) + len(collapsed) == len(seen.prompts)
           and all(p[1:-2].isdigit() for p in shown) and all(c.get("execution_count") for c in collapsed))
    assert ran, f"{notebook}: not every cell ran: {seen.prompts} ({len(collapsed)} collapsed)"
    assert not missing, f"{notebook}: not shown in the browser: " + "; ".join(missing)
