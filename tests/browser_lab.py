"""JupyterLab in Debian's Chromium, driven as an attendee drives it (tests/test_browser_lab.py).

``LabServer`` starts JupyterLab on a free loopback port with a token of its own (never printed: a log shown in a
failure has it replaced), with the settings ``workshop lab`` gives it (helpers/data/jupyterlab's overrides, the seeded
layout) and a Jupyter configuration of its own, so the user's settings and extensions change nothing. ``LabPage`` is
one headless Chromium window on it: open a notebook, Run > Run All Cells from the menu, wait for every cell, read what
the page shows (error and stderr outputs, the browser console's SEVERE entries, elements by CSS selector) and save
screenshots scrolled through the notebook.

Debian's packages only (``apt-get install chromium chromium-driver``): a browser download from elsewhere does not
work on the kit's machines, and selenium's own driver lookup is never used (both paths are given).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import nbformat

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
INSTALL_BROWSER = "Chromium is not installed: `sudo apt-get install -y chromium chromium-driver` (Debian/Ubuntu)"
INSTALL_SELENIUM = "selenium is not installed in this environment: `pip install selenium==4.51.0` (the dev extra's pin)"
# headless, and nothing that reaches the network on its own (updates, sync, QUIC probes)
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                  "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync")
WINDOW = (1600, 1000)  # pixels: wide enough for the explorer's 520 px controls beside the file browser
# what a cell wrote to stderr, as JupyterLab marks it; a raised error's traceback is marked the same, so errors are
# read from the saved notebook (``saved_errors``)
STDERR_OUTPUTS = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
# the name on the main area's current tab, once that tab is a notebook showing its cells ('' before)
CURRENT_NOTEBOOK = ("const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');"
                    "const tab = document.querySelector('#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current "
                    ".lm-TabBar-tabLabel');"
                    "return panel && panel.querySelector('.jp-Cell') && tab ? tab.textContent : ''")
SCROLLER = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer"  # the visible notebook's scrolling part


def missing() -> str | None:
    """What is missing to drive a browser here, with how to install it; None when Chromium, its driver and selenium
    are there."""
    import importlib.util

    if not (CHROMIUM.is_file() and CHROMEDRIVER.exists()):
        return INSTALL_BROWSER
    return None if importlib.util.find_spec("selenium") is not None else INSTALL_SELENIUM


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LabServer:
    """JupyterLab on ``workspace`` (a copy of the notebooks), on a free loopback port, until ``stop()``. The kernels
    inherit this process's environment: started inside ``SharedEngine.use()`` they reach the suite's engine."""

    def __init__(self, workspace: Path, home: Path) -> None:
        from helpers.lab.workspace import JUPYTERLAB_SETTINGS, seed_lab_layout

        self.workspace, self.port, self.token = workspace, free_port(), secrets.token_hex(16)
        self.log = home / "jupyterlab.log"
        jupyter = {name: home / name.lower() for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR",
                                                           "JUPYTER_RUNTIME_DIR", "IPYTHONDIR")}
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--notebook-dir={workspace}",
               "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
               f"--LabApp.app_settings_dir={JUPYTERLAB_SETTINGS}",  # as `workshop lab` starts it
               f"--LabApp.workspaces_dir={seed_lab_layout(workspace)}",
               f"--LabApp.user_settings_dir={home / 'user-settings'}"]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        env = {**os.environ, **{k: str(v) for k, v in jupyter.items()}, "JUPYTER_TOKEN": self.token}  # not in argv
        with self.log.open("w") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workspace)

    def api(self, path: str, method: str = "GET") -> Any:
        """One of the server's REST endpoints (``/api/sessions``): its JSON answer (None when it has no body)."""
        request = urllib.request.Request(f"{self.base}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            body = answer.read()
        return json.loads(body) if body else None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, notebook: str) -> str:
        """The address that opens ``notebook`` (logs in with the token): for the browser only, never printed."""
        return f"{self.base}/lab/tree/{notebook}?token={self.token}"

    def wait_ready(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                self.api("/api/status")
                return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"JupyterLab did not answer within {timeout_s:g} s:\n{self.log_tail()}")

    def kernel_state(self, notebook: str) -> str | None:
        """The execution state of ``notebook``'s kernel (``idle``, ``busy``, ``starting``), None before it has one."""
        for session in self.api("/api/sessions"):
            if session.get("path") == notebook and session.get("kernel"):
                return session["kernel"].get("execution_state")
        return None

    def remove(self, notebook: str) -> None:
        """Shut down ``notebook``'s kernel and delete the file (REST API), as if it had never been there."""
        for session in self.api("/api/sessions"):
            if session.get("path") == notebook:
                self.api(f"/api/sessions/{session['id']}", method="DELETE")
        self.api(f"/api/contents/{notebook}", method="DELETE")

    def log_tail(self, chars: int = 3000) -> str:
        """The end of JupyterLab's log, the token replaced."""
        return self.log.read_text(errors="replace")[-chars:].replace(self.token, "<token>")

    def stop(self) -> None:
        """Stop JupyterLab and its kernels (SIGTERM; SIGKILL after 20 s)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


class LabPage:
    """One headless Chromium window on a LabServer."""

    def __init__(self, server: LabServer, profile_dir: Path) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}", f"--window-size={WINDOW[0]},{WINDOW[1]}"):
            options.add_argument(flag)
        options.binary_location = str(CHROMIUM)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.server = server
        self.driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
        self.driver.set_script_timeout(30)

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def open(self, notebook: str, timeout_s: float = 90) -> None:
        """Open ``notebook`` as an attendee does (the lab's address the first time, then a double click in the file
        browser: no reload re-renders the notebooks open before) and wait until it shows with an idle kernel."""
        from selenium.webdriver.common.action_chains import ActionChains

        if not self.driver.current_url.startswith(self.server.base):
            self.driver.get(self.server.url(notebook))
        else:
            ActionChains(self.driver).double_click(self.listed(notebook)).perform()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            current = self.js(CURRENT_NOTEBOOK)
            if current.strip() == notebook and self.server.kernel_state(notebook) == "idle":
                return
            time.sleep(0.5)
        raise TimeoutError(f"{notebook} did not open with an idle kernel within {timeout_s:g} s")

    def menu(self, top: str, item: str) -> None:
        """Click the menu bar's ``top`` menu, then its item labelled ``item``."""
        from selenium.webdriver.common.by import By

        labels = [e for e in self.driver.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-itemLabel") if e.text == top]
        assert labels, f"no menu {top!r} in JupyterLab's menu bar"
        labels[0].click()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            items = [e for e in self.driver.find_elements(By.CSS_SELECTOR, ".lm-Menu-itemLabel")
                     if e.is_displayed() and e.text.strip() == item]
            if items:
                items[0].click()
                return
            time.sleep(0.2)
        raise AssertionError(f"no item {item!r} in the {top!r} menu")

    def listed(self, name: str, timeout_s: float = 15) -> Any:
        """``name``'s entry in the file browser (waits while the listing redraws)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.js("return Array.from(document.querySelectorAll('.jp-DirListing-itemText'))"
                            ".find(e => e.textContent.trim() === arguments[0]) || null", name)
            if found is not None:
                return found
            time.sleep(0.5)
        raise AssertionError(f"no {name} in the lab's file browser within {timeout_s:g} s")

    def forget(self, notebook: str) -> None:
        """File > Close Tab on ``notebook`` (saved: no question asked), its kernel and file removed, the file browser
        refreshed: the lab as if it had never been there."""
        from selenium.webdriver.common.by import By

        assert self.js(CURRENT_NOTEBOOK).strip() == notebook, f"{notebook} is not the current tab"
        self.menu("File", "Close Tab")
        self.server.remove(notebook)
        for button in self.driver.find_elements(By.CSS_SELECTOR, '[data-command="filebrowser:refresh"]'):
            if button.is_displayed():
                button.click()
        deadline = time.monotonic() + 15
        while self.js("return Array.from(document.querySelectorAll('.jp-DirListing-itemText'))"
                      ".some(e => e.textContent.trim() === arguments[0])", notebook):
            assert time.monotonic() < deadline, f"{notebook} still in the file browser 15 s after it was deleted"
            time.sleep(0.5)

    def cell_prompts(self) -> list[str]:
        """The input prompt of every code cell of the visible notebook: ``[3]:`` ran, ``[*]:`` runs or waits."""
        return self.js("const p = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');"
                       "return p ? Array.from(p.querySelectorAll('.jp-CodeCell .jp-InputPrompt'))"
                       ".map(e => e.textContent.trim()) : []")

    def run_all(self, notebook: str, timeout_s: float) -> float:
        """Run > Run All Cells; wait until no cell waits and the kernel is idle. Seconds it took."""
        t0 = time.monotonic()
        self.menu("Run", "Run All Cells")
        time.sleep(1)
        while time.monotonic() - t0 < timeout_s:
            prompts = self.cell_prompts()
            waiting = [p for p in prompts if "*" in p]
            if prompts and not waiting and self.server.kernel_state(notebook) == "idle":
                time.sleep(1)  # the last outputs and widgets render
                if not any("*" in p for p in self.cell_prompts()):
                    return time.monotonic() - t0
            time.sleep(1)
        raise TimeoutError(f"{notebook}: cells still running after {timeout_s:g} s")

    def save(self, notebook: str, timeout_s: float = 30) -> nbformat.NotebookNode:
        """File > Save Notebook; the notebook as saved, once the file holds this run's outputs."""
        path = self.server.workspace / notebook
        before = path.stat().st_mtime_ns
        self.menu("File", "Save Notebook")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if path.stat().st_mtime_ns != before:
                try:
                    return nbformat.read(path, as_version=4)
                except ValueError:  # caught mid-write
                    pass
            time.sleep(0.5)
        raise TimeoutError(f"{notebook} was not saved within {timeout_s:g} s of File > Save Notebook")

    def texts(self, selector: str) -> list[str]:
        """The text of every element of the visible notebook that matches ``selector`` (first 500 characters)."""
        return self.js("const p = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');"
                       "return p ? Array.from(p.querySelectorAll(arguments[0]))"
                       ".map(e => e.textContent.slice(0, 500)) : []", selector)

    def count(self, selector: str) -> int:
        return len(self.texts(selector))

    def console_entries(self) -> list[dict[str, Any]]:
        """The browser console's entries since the last call (level, message)."""
        return self.driver.get_log("browser")

    def screenshots(self, folder: Path, stem: str, limit: int = 40) -> list[Path]:
        """Screenshots of the visible notebook, top to bottom, each starting 100 px above the end of the one before."""
        folder.mkdir(parents=True, exist_ok=True)
        find = f"const n = document.querySelector('{SCROLLER}');"
        measure = find + " return n ? [n.scrollHeight, n.clientHeight] : [0, 0]"
        saved, y = [], 0
        while len(saved) < limit:
            self.js(find + " if (n) n.scrollTop = arguments[0];", y)
            time.sleep(0.5)
            path = folder / f"{stem}_{len(saved) + 1:02d}.png"
            self.driver.save_screenshot(str(path))
            saved.append(path)
            height, shown = self.js(measure)
            y += max(shown - 100, 100)
            if y >= height - 100:
                break
        return saved

    def element_screenshot(self, selector: str, path: Path) -> Path | None:
        """A screenshot of the first element of the visible notebook matching ``selector`` (None when there is none)."""
        from selenium.webdriver.common.by import By

        found = self.driver.find_elements(By.CSS_SELECTOR, f".jp-NotebookPanel:not(.lm-mod-hidden) {selector}")
        if not found:
            return None
        self.js("arguments[0].scrollIntoView({block: 'start'})", found[0])
        time.sleep(0.5)
        found[0].screenshot(str(path))
        return path

    def quit(self) -> None:
        self.driver.quit()


def saved_errors(nb: nbformat.NotebookNode) -> list[str]:
    """``ename: evalue`` of every error output of a saved notebook, with its cell's number."""
    return [f"cell {i}: {out.get('ename')}: {out.get('evalue', '')[:300]}" for i, cell in enumerate(nb.cells)
            if cell.cell_type == "code" for out in cell.get("outputs", []) if out.get("output_type") == "error"]


def copy_shots(paths: list[Path], folder: Path) -> None:
    """Copy screenshots (and the executed notebooks) into ``folder`` (build/browser/), for a developer to look at."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in paths:
        shutil.copyfile(path, folder / path.name)
