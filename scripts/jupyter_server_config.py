# Jupyter server config for this repo, installed by scripts/setup.sh as .venv/etc/jupyter/jupyter_server_config.py
# (a config path of the venv's JupyterLab). Saving a notebook of notebooks/ from JupyterLab keeps it clean: its
# outputs and execution counts are dropped before it is written, so a committed notebook (a DVC dependency of its
# stage) never carries a run's outputs, `dvc repro` does not rerun a stage because someone looked at it, and the
# run's commit is not stamped +dirty. The outputs stay in the open tab; the executed copies DVC and papermill keep
# (results/<name>/<name>.ipynb) are not touched. Any other notebook saves as it is.
import warnings
from pathlib import Path

# the server applies its config twice, and traitlets warns that the hook replaces itself
warnings.filterwarnings("ignore", message=r"Overriding existing pre_save_hook \(strip_committed_notebook\)")


def strip_committed_notebook(model, path, contents_manager, **kwargs):
    """pre_save_hook: clear the outputs of a notebook saved into a pflrepro checkout's notebooks/ folder."""
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    os_path = Path(contents_manager._get_os_path(path)).resolve()
    repo = os_path.parent.parent
    if os_path.parent.name != "notebooks" or not (repo / "dvc.yaml").exists() or not (repo / "params").is_dir():
        return
    for cell in model["content"].get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None


c = get_config()  # noqa: F821  (defined by Jupyter when it loads this file)
c.FileContentsManager.pre_save_hook = strip_committed_notebook
