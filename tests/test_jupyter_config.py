"""scripts/jupyter_server_config.py (installed into the venv by scripts/setup.sh): JupyterLab saves a notebook of a
checkout's notebooks/ without outputs (issue 16: a saved run's outputs in a tracked DVC dependency reran its stage
and stamped every table +dirty), and any other notebook as it is. Checked here on the hook as the server calls it;
checked by hand on a real `jupyter server` (a PUT of a notebook with outputs to notebooks/ and to another folder)."""
import copy
import json
from pathlib import Path

from traitlets.config import Config

from pflrepro.paths import REPO_ROOT

CONFIG = REPO_ROOT / "scripts" / "jupyter_server_config.py"


def _hook():
    cfg = Config()
    exec(compile(CONFIG.read_text(), str(CONFIG), "exec"), {"get_config": lambda: cfg})
    return cfg.FileContentsManager.pre_save_hook


class _Contents:
    def __init__(self, root: Path):
        self.root = root

    def _get_os_path(self, path):
        return str(self.root / path)


def _model():
    nb = json.loads((REPO_ROOT / "notebooks" / "example.ipynb").read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [{"output_type": "stream", "name": "stdout", "text": "x"}], 4
    return {"type": "notebook", "content": nb}


def test_saving_a_committed_notebook_drops_its_outputs_and_nothing_else(tmp_path):
    hook = _hook()
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "params").mkdir()
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    model = _model()
    before = copy.deepcopy(model)
    hook(model=model, path="notebooks/example.ipynb", contents_manager=_Contents(tmp_path))
    code = [c for c in model["content"]["cells"] if c["cell_type"] == "code"]
    assert code and all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    assert [c["source"] for c in model["content"]["cells"]] == [c["source"] for c in before["content"]["cells"]]
    for path in ("results/example/example.ipynb", "scratch.ipynb"):    # executed copies, a user's own notebook
        model = _model()
        hook(model=model, path=path, contents_manager=_Contents(tmp_path))
        assert model == _model(), path
    model = _model()   # a folder named notebooks outside a pflrepro checkout
    hook(model=model, path="notebooks/example.ipynb", contents_manager=_Contents(tmp_path / "elsewhere"))
    assert model == _model()


def test_setup_installs_the_config_where_the_venvs_jupyter_reads_it():
    setup = (REPO_ROOT / "scripts" / "setup.sh").read_text()
    assert 'cp scripts/jupyter_server_config.py "$VENV/etc/jupyter/jupyter_server_config.py"' in setup
