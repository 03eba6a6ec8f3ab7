"""examples/capsule_layers_mnist.ipynb: committed with its outputs, and it runs top to bottom."""

import json
import os

import pytest

from tests.conftest import REPO_ROOT

NOTEBOOK = os.path.join(REPO_ROOT, "examples", "capsule_layers_mnist.ipynb")
# What the walkthrough shows, each in some code cell's source.
_STEPS = (
    "PrimaryCapsule(", "CapsuleLayer(", "Length(", "Mask(", "keras.Model(", "tfds.load(",
    "model.fit(", "plot_perturbations(", "return_couplings=True", ".save(",
    "keras.saving.load_model(", ".export(", "signatures[",
)


def _images(cell):
    return [output for output in cell.get("outputs", [])
            if "image/png" in output.get("data", {})]


def check_executed_notebook(notebook):
    """The checks of an executed notebook: every cell run once in order, no error, figures."""
    code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert len(code) >= 10
    sources = ["".join(cell["source"]) for cell in code]
    for step in _STEPS:
        assert any(step in source for source in sources), f"no code cell does {step}"
    # Run top to bottom in one kernel: execution counts 1, 2, 3, ...
    assert [cell["execution_count"] for cell in code] == list(range(1, len(code) + 1))
    errors = [output for cell in code for output in cell.get("outputs", [])
              if output["output_type"] == "error"]
    assert errors == [], errors
    # Capsule lengths, reconstructions, the perturbation grid, the routing couplings.
    figures = [cell for cell in code if _images(cell)]
    assert len(figures) >= 4, len(figures)
    for cell in figures:
        for output in _images(cell):
            png = output["data"]["image/png"]
            assert len(png) > 5000 and png.startswith("iVBORw0KGgo"), len(png)  # a PNG
    texts = "".join(
        "".join(output.get("text", "")) for cell in code for output in cell.get("outputs", [])
    )
    assert "same lengths after reloading: True" in texts
    assert "same lengths as the Keras model: True" in texts
    assert "test accuracy on 2000 images:" in texts


def test_committed_notebook_holds_its_outputs():
    """The committed file: executed, no errors, its figures inline (no kernel needed)."""
    with open(NOTEBOOK) as file:
        notebook = json.load(file)
    assert notebook["nbformat"] == 4
    assert notebook["metadata"]["kernelspec"]["name"] == "python3"
    check_executed_notebook(notebook)
    markdown = "".join("".join(cell["source"]) for cell in notebook["cells"]
                       if cell["cell_type"] == "markdown")
    assert "docs/layers.md" in markdown


def test_checks_catch_a_notebook_without_outputs():
    with open(NOTEBOOK) as file:
        notebook = json.load(file)
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    with pytest.raises(AssertionError):
        check_executed_notebook(notebook)


@pytest.mark.large
def test_notebook_runs_in_a_fresh_kernel(tfds_data_dir, tmp_path):
    """Executes every cell in a new kernel (minutes); any cell's error fails the test."""
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    client = nbclient.NotebookClient(
        notebook, timeout=1200, kernel_name="python3",
        resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}},
    )
    client.execute()  # raises CellExecutionError naming the cell
    nbformat.write(notebook, str(tmp_path / "executed.ipynb"))
    check_executed_notebook(json.loads((tmp_path / "executed.ipynb").read_text()))
