"""Browser check of a notebook in JupyterLab (issue 16): headless Chromium opens a copy of notebooks/example.ipynb
in a real `jupyter lab`, runs all its cells from the Run menu, waits for the kernel to go idle and checks the page:
every code cell ran, no error output (a traceback, an exception), no "IProgress not found" warning, and at least
one figure rendered inline (an <img> that loaded).

    .venv/bin/python scripts/browser_check.py [--notebook notebooks/example.ipynb] [--profile smoke] [--timeout 300]

It installs nothing. It needs Debian's Chromium and its driver (`apt-get install chromium chromium-driver`:
/usr/bin/chromium and /usr/bin/chromedriver; Selenium is pointed at them, so it downloads no browser) and Selenium
in the venv (`.venv/bin/pip install selenium`), besides the venv's JupyterLab (scripts/setup.sh). The copy runs at
the `smoke` profile (its parameters cell is rewritten: profile, out_dir in the scratch folder, jobs=1), in a
scratch folder under the system temp dir, so nothing of the checkout changes: not notebooks/ (the committed
notebook is never saved), not results/ or metrics/. Prints one line per check, exits 1 when one fails (2 when the
check could not run) and stops JupyterLab, its kernel and Chromium on exit, Ctrl-C included.
`--artifacts DIR` keeps a screenshot, the page's HTML and JupyterLab's log there when a check fails.
tests/test_browser_check.py runs it end to end where Chromium, chromedriver and Selenium are installed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
NUMBERED = re.compile(r"^\[\d+\]:?$")     # an executed code cell's prompt ("[ ]:" not run, "[*]:" queued or running)

# JupyterLab settings for the scratch session: every cell kept in the DOM (no windowing), no news or update toasts
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
}

# what the page shows, read in one go: the code cells' prompts, the kernel's state (the toolbar's execution
# indicator reads "idle" before a kernel is even started; the kernel name in the toolbar and "<kernel> | Idle" in
# the status bar do not), open dialogs, error outputs, inline images. JupyterLab 4 renders an exception as a stderr
# output (data-mime-type application/vnd.jupyter.stderr, the traceback in ANSI colours), as it renders a stream to
# stderr (a warning, tqdm's text bar): an error is a stderr output that reads like one.
PAGE_STATE_JS = r"""
const cells = [...document.querySelectorAll('.jp-Notebook .jp-Cell.jp-CodeCell')];
const prompts = cells.map(c => ((c.querySelector('.jp-InputArea-prompt') || {}).textContent || '').trim());
const ind = document.querySelector('.jp-Notebook-ExecutionIndicator');
const kernel = document.querySelector('.jp-Toolbar-kernelName');
const kernelStatus = [...document.querySelectorAll('.jp-StatusBar-TextItem')].map(e => e.textContent.trim())
  .find(t => / \| /.test(t));
const errors = [...document.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
  .map(e => e.textContent).filter(t => /Traceback|Error\b|Exception\b/.test(t));
const imgs = [...document.querySelectorAll('.jp-OutputArea-output.jp-RenderedImage img')];
return {prompts: prompts,
        status: ind ? ind.getAttribute('data-status') : null,
        kernel: kernel ? kernel.textContent.trim() : null,
        kernel_status: kernelStatus || null,
        dialogs: [...document.querySelectorAll('.jp-Dialog')].map(d => d.textContent.slice(0, 300)),
        errors: errors,
        images: imgs.map(i => [i.naturalWidth, i.naturalHeight]),
        iprogress: document.body.innerText.includes('IProgress not found')};
"""


class CheckError(RuntimeError):
    """The check could not run (a server or browser that did not start, a notebook that never finished)."""


def set_parameters(source: str, **values) -> str:
    """The parameters cell's source with each `name = ...` line's value replaced by repr(value), its comment kept."""
    for name, value in values.items():
        pattern = re.compile(rf"^({re.escape(name)}\s*=\s*)(.*?)(\s+#.*)?$", re.M)
        if not pattern.search(source):
            raise ValueError(f"the parameters cell has no `{name} = ...` line")
        source = pattern.sub(lambda m: m.group(1) + repr(value) + (m.group(3) or ""), source, count=1)
    return source


def prepare_notebook(src: Path, dest_dir: Path, **params) -> Path:
    """A copy of notebook `src` in dest_dir, outputs cleared, its `parameters`-tagged cell set to params."""
    import nbformat
    nb = nbformat.read(src, as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise CheckError(f"{src}: expected one cell tagged `parameters`, found {len(cells)}")
    cells[0].source = set_parameters(cells[0].source, **params)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    dest = dest_dir / src.name
    nbformat.write(nb, dest)
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_lab_settings(settings_dir: Path) -> None:
    for rel, values in LAB_SETTINGS.items():
        path = settings_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


def start_jupyter(root_dir: Path, scratch: Path, port: int, token: str, log_path: Path) -> subprocess.Popen:
    """`jupyter lab` of the venv on 127.0.0.1:port serving root_dir, in its own process group (the kernel with it)."""
    jupyter = ROOT / ".venv" / "bin" / "jupyter"
    jupyter = str(jupyter) if jupyter.exists() else shutil.which("jupyter") or "jupyter"
    write_lab_settings(scratch / "lab-settings")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "JUPYTER_RUNTIME_DIR": str(scratch / "runtime")}
    argv = [jupyter, "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root_dir}",
            f"--LabApp.user_settings_dir={scratch / 'lab-settings'}",
            f"--LabApp.workspaces_dir={scratch / 'lab-workspaces'}", "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.extension_manager=readonly",
            *(["--allow-root"] if os.geteuid() == 0 else [])]
    log = open(log_path, "w")
    try:
        return subprocess.Popen(argv, cwd=root_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        log.close()


def wait_for_server(proc: subprocess.Popen, port: int, token: str, log_path: Path, timeout: float = 90) -> None:
    url = f"http://127.0.0.1:{port}/api/status?token={token}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CheckError(f"jupyter lab exited ({proc.returncode}):\n{log_path.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise CheckError(f"jupyter lab did not answer on port {port} within {timeout:.0f} s")


def stop_jupyter(proc: subprocess.Popen) -> None:
    """SIGTERM to JupyterLab's process group (it shuts its kernels down), SIGKILL after 10 s; then any process it
    started that is still there (a kernel runs in a session of its own), by pid."""
    import psutil
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            break
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def start_browser():
    """Headless Chromium through the system chromedriver (Selenium downloads nothing), the driver in a session of
    its own (a Ctrl-C in the terminal reaches this script, which then closes the browser, not the driver)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run",
                "--window-size=1400,1000", "--disable-extensions", "--disable-breakpad", "--disable-crash-reporter"):
        opts.add_argument(arg)
    service = Service(executable_path=CHROMEDRIVER, popen_kw={"start_new_session": True})
    return webdriver.Chrome(options=opts, service=service)


def process_tree(pid: int) -> list:
    """psutil.Process of pid and of every process under it; [] when it is gone."""
    import psutil
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def stop_browser(driver, processes: list) -> None:
    """Quit Chromium through its driver, then kill what is left of the processes `started` (chromedriver and
    Chromium's, listed when the browser came up) and of those they started since."""
    import psutil
    try:
        driver.quit()
    except Exception:  # noqa: BLE001  (the driver may already be gone)
        pass
    left = {p.pid: p for root in processes if root.is_running() for p in process_tree(root.pid)}
    for p in left.values():
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def wait_until(driver, predicate, timeout: float, what: str, poll: float = 0.5):
    """Poll PAGE_STATE_JS until predicate(state) holds; the state then. CheckError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        state = driver.execute_script(PAGE_STATE_JS)
        if not isinstance(state, dict):
            raise CheckError(f"the page did not answer while waiting for {what} (got {state!r})")
        if predicate(state):
            return state
        time.sleep(poll)
    raise CheckError(f"timed out after {timeout:.0f} s waiting for {what}; last page state: {state}")


def kernel_ready(state: dict) -> bool:
    """A kernel started, connected and idle: named in the toolbar, "<kernel> | Idle" in the status bar."""
    return (state["status"] == "idle" and state["kernel"] not in (None, "", "No Kernel")
            and (state["kernel_status"] or "").endswith("| Idle"))


def open_notebook(driver, port: int, token: str, rel_path: str, n_cells: int, timeout: float) -> dict:
    """Open the notebook in JupyterLab and wait for all its code cells and a ready kernel."""
    driver.get(f"http://127.0.0.1:{port}/lab/tree/{rel_path}?token={token}")
    return wait_until(driver, lambda s: len(s["prompts"]) == n_cells and kernel_ready(s) or s["dialogs"],
                      timeout, f"the notebook to open ({n_cells} code cells) with its kernel idle")


def run_all_cells(driver, timeout: float) -> None:
    """Run > Run All Cells, from the menu bar."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait
    wait = WebDriverWait(driver, timeout)
    menu = wait.until(ec.element_to_be_clickable(
        (By.XPATH, "//li[contains(@class,'lm-MenuBar-item')][.//div[normalize-space()='Run']]")))
    menu.click()
    item = wait.until(ec.element_to_be_clickable(
        (By.CSS_SELECTOR, ".lm-Menu li.lm-Menu-item[data-command='runmenu:run-all'], "
                          ".lm-Menu li.lm-Menu-item[data-command='notebook:run-all-cells']")))
    item.click()


def started(state: dict, n_cells: int) -> bool:
    """Whether a run of all cells has begun: a `[*]` (queued or running) prompt, every cell numbered, a dialog, or
    an error output (a run that stopped at a failing cell between two polls leaves the cells after it unnumbered)."""
    prompts = state["prompts"]
    return bool(state["dialogs"] or state["errors"] or any("*" in p for p in prompts)
                or (len(prompts) == n_cells and all(NUMBERED.match(p) for p in prompts)))


def run_and_wait(driver, n_cells: int, timeout: float, tries: int = 3) -> dict:
    """Run All Cells, then wait for the kernel to finish. A click that no cell answers within 15 s (seen once, the
    click right after the kernel first went idle) is repeated."""
    for attempt in range(1, tries + 1):
        run_all_cells(driver, timeout=30)
        try:
            wait_until(driver, lambda s: started(s, n_cells), 15, "Run All Cells to start", poll=0.2)
            break
        except CheckError:
            if attempt == tries:
                raise
    return wait_until(driver, lambda s: s["dialogs"] or (not any("*" in p for p in s["prompts"])
                                                          and kernel_ready(s)),
                      timeout, "the notebook to finish running", poll=1.0)


def page_checks(state: dict, n_cells: int, min_images: int = 1) -> list[tuple[bool, str]]:
    """(passed, line) for each check of the page state after the run."""
    ran = sum(bool(NUMBERED.match(p)) for p in state["prompts"])
    loaded = [wh for wh in state["images"] if wh[0] > 0 and wh[1] > 0]
    errors = "; ".join(e.strip().splitlines()[-1][:300] if e.strip() else "" for e in state["errors"])
    return [(not state["dialogs"], "no dialog open" if not state["dialogs"] else f"dialog: {state['dialogs']}"),
            (ran == n_cells, f"{ran} of {n_cells} code cells ran"),
            (not state["errors"], "no error output" if not state["errors"]
             else f"{len(state['errors'])} error output(s): {errors}"),
            (not state["iprogress"], "no 'IProgress not found' warning" if not state["iprogress"]
             else "the page shows 'IProgress not found'"),
            (len(loaded) >= min_images, f"{len(loaded)} inline image(s) rendered (at least {min_images} expected)"
             if len(loaded) >= min_images else f"{len(loaded)} inline image(s) rendered, {min_images} expected "
                                               f"({len(state['images'])} <img> in the outputs)")]


def save_artifacts(driver, out: Path | None, log_path: Path) -> None:
    """A screenshot, the page's HTML and JupyterLab's log in `out` (when given), for a failed check."""
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    try:
        if driver is not None:
            driver.save_screenshot(str(out / "page.png"))
            (out / "page.html").write_text(driver.page_source)
    except Exception as e:  # noqa: BLE001  (a dead browser: keep the log at least)
        print(f"no screenshot: {type(e).__name__}")
    if log_path.exists():
        shutil.copy(log_path, out / "jupyter.log")
    print(f"artifacts: {out}")


def check(args: argparse.Namespace, stack: ExitStack) -> bool:
    """Start JupyterLab and Chromium (stopped by `stack`), run the notebook's copy, print the checks."""
    import nbformat
    from selenium.common.exceptions import WebDriverException
    scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pflrepro-browser-check-")))
    work = scratch / "work"
    work.mkdir()
    nb_path = prepare_notebook(args.notebook, work, profile=args.profile, out_dir=str(scratch / "out"), jobs=1)
    n_cells = sum(c.cell_type == "code" for c in nbformat.read(nb_path, as_version=4).cells)
    port, token, log_path = free_port(), secrets.token_hex(16), scratch / "jupyter.log"
    t0 = time.monotonic()
    proc = start_jupyter(work, scratch, port, token, log_path)
    stack.callback(stop_jupyter, proc)
    driver = None
    try:
        wait_for_server(proc, port, token, log_path)
        print(f"ok   jupyter lab answers on 127.0.0.1:{port} ({time.monotonic() - t0:.0f} s)", flush=True)
        driver = start_browser()
        stack.callback(stop_browser, driver, process_tree(driver.service.process.pid))
        state = open_notebook(driver, port, token, nb_path.name, n_cells, timeout=120)
        print(f"ok   {nb_path.name} open, kernel idle ({time.monotonic() - t0:.0f} s)", flush=True)
        if not state["dialogs"]:
            state = run_and_wait(driver, n_cells, timeout=args.timeout)
            print(f"ok   run all cells finished ({time.monotonic() - t0:.0f} s)", flush=True)
    except (CheckError, WebDriverException) as e:
        save_artifacts(driver, args.artifacts, log_path)
        raise e if isinstance(e, CheckError) else CheckError(f"the browser: {e.msg or type(e).__name__}") from e
    results = page_checks(state, n_cells, args.min_images)
    for passed, line in results:
        print(f"{'ok  ' if passed else 'FAIL'} {line}", flush=True)
    if not all(passed for passed, _ in results):
        save_artifacts(driver, args.artifacts, log_path)
    return all(passed for passed, _ in results)


def _raise_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Run a notebook's copy in JupyterLab in headless Chromium and check "
                                             "the page (see the module docstring).")
    ap.add_argument("--notebook", type=Path, default=ROOT / "notebooks" / "example.ipynb",
                    help="the notebook to copy and run (default: notebooks/example.ipynb)")
    ap.add_argument("--profile", default="smoke", help="the profile the copy runs (default: smoke)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds the notebook may take to run")
    ap.add_argument("--min-images", type=int, default=2, help="inline images the outputs must show (default 2: the "
                    "example draws its learning curves and its partition)")
    ap.add_argument("--artifacts", type=Path, default=None, help="keep a screenshot, page HTML and log here on failure")
    args = ap.parse_args(argv)
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install selenium)")
    if missing:
        print(f"cannot run: missing {', '.join(missing)}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    t0 = time.monotonic()
    with ExitStack() as stack:
        try:
            passed = check(args, stack)
        except CheckError as e:
            print(f"FAIL {e}", flush=True)
            return 2
        except KeyboardInterrupt:
            print("interrupted: stopping JupyterLab and Chromium", flush=True)
            return 130
    print(f"{'passed' if passed else 'FAILED'} in {time.monotonic() - t0:.0f} s", flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
