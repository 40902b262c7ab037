"""gymfleet.testing.nemo_gym_wheel: NeMo-Gym's release is downloaded once, version-checked and unpacked atomically."""

from __future__ import annotations

import zipfile

import pytest

from gymfleet.testing import nemo_gym_wheel as wheel_module
from gymfleet.testing.nemo_gym_wheel import NEMO_GYM_VERSION, WheelUnavailableError, nemo_gym_folder, nemo_gym_wheel


def test_the_release_is_unpacked_with_its_environments_and_a_second_call_reuses_it(monkeypatch):
    root = nemo_gym_wheel()
    assert (root / f"nemo_gym-{NEMO_GYM_VERSION}.dist-info" / "METADATA").is_file()
    assert (nemo_gym_folder("mcqa") / "data" / "example.jsonl").is_file()
    monkeypatch.setattr(wheel_module, "_download", lambda *a: pytest.fail("downloaded again"))
    assert nemo_gym_wheel() == root


def test_an_unknown_environment_is_named():
    with pytest.raises(FileNotFoundError, match="no resources_servers/no_such_env/"):
        nemo_gym_folder("no_such_env")


def test_a_wheel_of_another_version_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("GYMFLEET_CACHE_DIR", str(tmp_path / "cache"))

    def fake_download(version, into):
        wheel = into / "nemo_gym-9.9.9-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr("nemo_gym-9.9.9.dist-info/METADATA",
                             "Metadata-Version: 2.1\nName: nemo-gym\nVersion: 9.9.9\n")
        return wheel

    monkeypatch.setattr(wheel_module, "_download", fake_download)
    with pytest.raises(WheelUnavailableError, match="declares version 9.9.9, not 1.2.3"):
        nemo_gym_wheel("1.2.3")
    assert not (tmp_path / "cache" / "nemo_gym-1.2.3").exists()


def test_no_index_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("GYMFLEET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(WheelUnavailableError, match="could not download nemo-gym==0.0.1"):
        nemo_gym_wheel("0.0.1")
