"""JupyterLab on the project, started by the README's command (``make lab`` runs ``scripts/lab.sh``): a real
lab server finds the ``driftscope (.venv)`` kernel with no JUPYTER_PATH, serves the notebooks, saving an opened
notebook leaves no git diff, and notebooks 01 and 02 run top to bottom in that kernel, which runs in
``notebooks/`` as the lab starts it (issue 19 items 1-3)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from chromium import chromium, needs_chromium
from conftest import ROOT
from driftscope.run.report import Report

requests = pytest.importorskip("requests")
websocket = pytest.importorskip("websocket")

TOKEN = uuid.uuid4().hex


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Lab:
    """A running lab server: its REST API and a kernel's channels over a websocket."""

    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}"
        self.headers = {"Authorization": f"token {TOKEN}"}

    def get(self, path: str):
        reply = requests.get(self.base + path, headers=self.headers, timeout=60)
        reply.raise_for_status()
        return reply.json()

    def send(self, method: str, path: str, body: dict):
        reply = requests.request(method, self.base + path, headers=self.headers, json=body, timeout=60)
        reply.raise_for_status()
        return reply.json() if reply.content else None

    def session(self, notebook: str) -> str:
        """A notebook session with the lab's default kernel, as opening the notebook does; the kernel's id."""
        session = self.send("POST", "/api/sessions", {"path": notebook, "type": "notebook", "name": notebook})
        return session["kernel"]["id"]

    def execute(self, kernel: str, code: str, timeout: float = 600) -> list[dict]:
        """Run ``code`` in the kernel; its outputs (stream, display_data, execute_result, error)."""
        channel = websocket.create_connection(
            f"{self.base.replace('http', 'ws')}/api/kernels/{kernel}/channels?token={TOKEN}", timeout=timeout
        )
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "username": "test", "session": uuid.uuid4().hex, "version": "5.3"}
        request = {
            "header": {**header, "msg_type": "execute_request"},
            "parent_header": {},
            "metadata": {},
            "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {}},
        }
        channel.send(json.dumps(request))
        outputs, idle, replied = [], False, None
        deadline = time.monotonic() + timeout
        try:
            while not (idle and replied) and time.monotonic() < deadline:
                message = json.loads(channel.recv())
                if message.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind = message["header"]["msg_type"]
                if kind == "execute_reply":
                    replied = message["content"]["status"]
                elif kind == "status":
                    idle = message["content"]["execution_state"] == "idle"
                elif kind in ("stream", "display_data", "execute_result", "error"):
                    outputs.append({"output_type": kind, **message["content"]})
        finally:
            channel.close()
        assert replied, f"no reply in {timeout} s to:\n{code}"
        return outputs


@pytest.fixture(scope="module")
def lab():
    """``scripts/lab.sh`` (what ``make lab`` runs) headless on a free port, with no JUPYTER_PATH set."""
    port = _free_port()
    checkpoints = ROOT / "notebooks" / ".ipynb_checkpoints"  # the lab's own copies (git-ignored): ours removed
    had_checkpoints = checkpoints.exists()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER_")}
    server = subprocess.Popen(
        ["bash", str(ROOT / "scripts" / "lab.sh"), "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1"]
        + [f"--IdentityProvider.token={TOKEN}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    client = Lab(port)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, f"the lab server exited: {server.stderr.read()[-3000:]}"
            try:
                client.get("/api/status")
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, "the lab server did not answer in 180 s"
                time.sleep(1)
        yield client
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        if not had_checkpoints:
            shutil.rmtree(checkpoints, ignore_errors=True)


def code_cells(notebook: dict) -> list[tuple[list[str], str]]:
    return [
        (cell["metadata"].get("tags", []), "".join(cell["source"]))
        for cell in notebook["cells"]
        if cell["cell_type"] == "code"
    ]


def errors(outputs: list[dict]) -> list[str]:
    return [f"{o['ename']}: {o['evalue']}" for o in outputs if o["output_type"] == "error"]


def test_the_lab_finds_the_project_kernel_and_serves_the_notebooks_unchanged(lab):
    specs = lab.get("/api/kernelspecs")
    assert specs["default"] == "driftscope"
    spec = specs["kernelspecs"]["driftscope"]["spec"]
    assert spec["display_name"] == "driftscope (.venv)" and Path(spec["argv"][0]).parent.parent.name == ".venv"
    names = {item["name"] for item in lab.get("/api/contents/notebooks")["content"]}
    assert {f"0{n}_" for n in range(1, 7)} <= {name[:3] for name in names if name.endswith(".ipynb")}
    # opening a notebook and saving it (what the lab does) rewrites nothing: no outputs, metadata or format change
    for name in sorted(n for n in names if n.endswith(".ipynb")):
        path = ROOT / "notebooks" / name
        before = path.read_bytes()
        model = lab.get(f"/api/contents/notebooks/{name}?content=1&type=notebook")
        assert model["type"] == "notebook" and model["content"]["metadata"]["kernelspec"]["name"] == "driftscope"
        lab.send("PUT", f"/api/contents/notebooks/{name}", {"type": "notebook", "content": model["content"]})
        assert path.read_bytes() == before, f"{name} changed when the lab saved it unmodified"


@pytest.mark.parametrize(
    "notebook",
    ["01_stage_parity", pytest.param("02_layer_drilldown", marks=pytest.mark.slow)],  # 02 captures a block: ~1 min
)
def test_notebooks_run_top_to_bottom_in_the_lab_kernel(lab, rendered_copy, notebook):
    """In the kernel the lab starts for the notebook (cwd ``notebooks/``): the default parameter file resolves
    from there, and every code cell runs without an error on a run's parameter file typed into the parameters
    cell (reusing its finished report; 02 captures the first divergent block's substages itself)."""
    code, out = rendered_copy  # 02 writes the substages it captures into the run: a copy of the shared one
    assert code in (0, 1)
    kernel = lab.session(f"notebooks/{notebook}.ipynb")
    where = lab.execute(
        kernel,
        "import os\nfrom driftscope.run.params import load_parameters\n"
        "print(os.getcwd(), load_parameters('parameters/demo_shapes.yaml').checkpoint)",
    )
    cwd, checkpoint = where[0]["text"].split()
    assert Path(cwd).resolve() == (ROOT / "notebooks").resolve()  # the package's notebooks, where the link leads
    assert Path(checkpoint) == ROOT / "fixtures/checkpoints/tiny-qwen2_5-vl"
    model = lab.get(f"/api/contents/notebooks/{notebook}.ipynb?content=1&type=notebook")
    shown = []
    for tags, source in code_cells(model["content"]):
        outputs = lab.execute(kernel, source)
        assert not errors(outputs), (source, errors(outputs))
        if "parameters" in tags:  # what a user types into the parameters cell
            lab.execute(kernel, f"params_path = {str(out.parent / 'p.yaml')!r}\nout_dir = {str(out)!r}")
        shown += outputs
    html = "".join(o.get("data", {}).get("text/html", "") for o in shown)
    pictures = [o for o in shown if "image/png" in o.get("data", {})]
    assert pictures and all(o["metadata"].get("image/png", {}).get("alt") for o in pictures)
    log = html[html.find("Progress log") :][:2000]  # says why, when the run was not reused
    assert "reusing the finished run" in log and "not reusing" not in log, log
    assert not [o for o in shown if o["output_type"] == "stream" and o["name"] == "stderr"]
    first = Report.load(out).data["first_divergence"]["mlx:bf16"]["stage"]
    if notebook == "01_stage_parity":
        assert "Verdict: FAIL" in "".join(o.get("data", {}).get("text/markdown", "") for o in shown)
        assert f">{first}<" in html and "Progress log" in html
    else:
        block = ".".join(first.split(".")[:3])  # the first divergence's block (it may be one of its substages)
        assert f"{block}.attn.context" in html  # a substage of the first divergent block, in the lab
        # issue 34 item 9: the explorer's pickers (a widget view; its figures are in its output widgets' state) and
        # the channel map in plotly's own form, which the lab's plotly extension draws
        widgets = [o for o in shown if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
        plotted = [o for o in shown if "application/vnd.plotly.v1+json" in o.get("data", {})]
        assert len(widgets) == 1 and plotted


@needs_chromium
def test_opening_a_notebook_in_the_lab_leaves_it_unmodified(lab):
    """In headless Chromium: the lab opens notebook 01 with the project kernel, and the notebook's tab is not
    marked modified (nothing rewritten on open); the file on disk is untouched."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as seen
    from selenium.webdriver.support.ui import WebDriverWait

    path = ROOT / "notebooks" / "01_stage_parity.ipynb"
    before = path.read_bytes()
    with chromium(1400, 900, window=True) as driver:
        driver.get(f"{lab.base}/lab/tree/notebooks/01_stage_parity.ipynb?token={TOKEN}&reset")
        wait = WebDriverWait(driver, 180)
        wait.until(seen.presence_of_element_located((By.CSS_SELECTOR, ".jp-NotebookPanel .jp-Cell")))
        name = wait.until(
            seen.presence_of_element_located((By.CSS_SELECTOR, ".jp-NotebookPanel .jp-Toolbar-kernelName"))
        )
        wait.until(lambda d: name.text.strip() == "driftscope (.venv)")
        time.sleep(5)  # anything the lab rewrites on open has happened by now
        tabs = driver.find_elements(By.CSS_SELECTOR, ".lm-DockPanel-tabBar .lm-TabBar-tab")
        opened = [t for t in tabs if "01_stage_parity.ipynb" in t.text]
        assert opened, [t.text for t in tabs]
        assert "jp-mod-dirty" not in opened[0].get_attribute("class")
        cells = driver.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel .jp-Cell")
        assert len(cells) == len(json.loads(before)["cells"])
    assert path.read_bytes() == before
