"""The notebooks run headless against a run the test builds, and are committed without outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from explore_builders import demo_model_run

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
NAMES = ("explore_checkpoint.ipynb", "convert_and_verify.ipynb")


@pytest.mark.parametrize("name", NAMES)
def test_committed_without_outputs(name):
    nb = json.loads((NOTEBOOKS / name).read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    params = [c for c in code if "parameters" in c["metadata"].get("tags", [])]
    assert len(params) == 1 and "MAXCKPT_NOTEBOOK_RUN_DIR" in "".join(params[0]["source"])


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return demo_model_run(tmp_path_factory.mktemp("nb") / "run", steps=(0, 1, 2, 3))


def execute(name: str, monkeypatch, **env: str):
    import nbformat
    import nbclient
    import matplotlib  # noqa: F401 - the notebooks extra: a real dependency, fail, never skip
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # the kernel process inherits them
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return nb


def outputs(nb, kind: str) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == kind]


def text(nb) -> str:
    return "".join(o.get("text", "") for o in outputs(nb, "stream"))


@pytest.mark.slow
def test_explore_notebook(run_dir, monkeypatch):
    nb = execute("explore_checkpoint.ipynb", monkeypatch, MAXCKPT_NOTEBOOK_RUN_DIR=str(run_dir))
    out = text(nb)
    assert "committed steps: [0, 1, 2, 3] | retention would delete next: nothing" in out  # step 0: every 20th is kept
    assert "180,800 model parameters" in out
    assert "39 tensors: 39 changed" in out
    images = [o for o in outputs(nb, "display_data") if "image/png" in o["data"]]
    assert len(images) == 3  # bytes per layer, norms across steps, diff between steps
    html = [o for o in outputs(nb, "display_data") if "text/html" in o["data"]]
    assert html  # rich tables (and treescope's tree)


@pytest.mark.slow
def test_convert_and_verify_notebook(run_dir, tmp_path, monkeypatch):
    nb = execute("convert_and_verify.ipynb", monkeypatch, MAXCKPT_NOTEBOOK_RUN_DIR=str(run_dir), MAXCKPT_NOTEBOOK_OUT_DIR=str(tmp_path / "out"))
    out = text(nb)
    assert "step 3 of" in out and "llama3.1, 4 layers" in out
    assert "Megatron copy vs MaxText, through the layouts: 39 tensors: 39 unchanged; max |a-b| 0" in out
    assert "max |logits diff| = " in out  # the notebook itself asserts it is within 1e-4
    assert (tmp_path / "out" / "hf" / "config.json").is_file()
    assert (tmp_path / "out" / "megatron" / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    assert [o for o in outputs(nb, "display_data") if "image/png" in o["data"]]


@pytest.mark.slow
def test_explore_notebook_on_a_bucket(run_dir, object_stores, monkeypatch):
    """The same run uploaded to the GCS emulator: the notebook reads it through gs:// unchanged."""
    from maxckpt.storage import objects

    store = object_stores["gs"]
    url = store.url(store.new_bucket(), "demo_run")
    for file in sorted(p for p in Path(run_dir).rglob("*") if p.is_file()):
        objects.write_bytes(f"{url}/{file.relative_to(run_dir).as_posix()}", file.read_bytes())
    nb = execute("explore_checkpoint.ipynb", monkeypatch, MAXCKPT_NOTEBOOK_RUN_DIR=url)
    out = text(nb)
    assert "committed steps: [0, 1, 2, 3] | retention would delete next: nothing" in out
    assert "39 tensors: 39 changed" in out
