"""`import audiopipe as ap`: every name in __all__ resolves to the callable the docs name, the import is cheap,
every exception class audiopipe defines derives from AudiopipeError, the package is typed."""

import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import audiopipe as ap

# Exceptions that never reach a user (none today: even the control flow between processes uses AudiopipeError).
INTERNAL: set[str] = set()


def test_every_public_name_resolves_to_its_definition():
    assert set(ap.__all__) >= {"shard", "verify", "inspect", "make_loader", "export_hf", "export_lhotse",
                               "export_nemo", "export_f5", "AudiopipeError"}
    for name in ap.__all__:
        if name in ("__version__", "shard"):
            continue
        value = getattr(ap, name)
        module, attr = ap._EXPORTS[name]
        assert value is getattr(importlib.import_module(module), attr), name
    assert "make_loader" in dir(ap) and "shard" in dir(ap)
    # ap.shard is the sub-package, callable as the job; importing its modules by any statement keeps it so
    import audiopipe.shard.run as run_module
    from audiopipe.shard import api

    assert ap.shard is sys.modules["audiopipe.shard"] and callable(ap.shard) 
    assert run_module.__name__ == "audiopipe.shard.run"
    assert api.shard.__doc__
    with pytest.raises(AttributeError, match="no_such_name"):
        ap.no_such_name


def test_import_is_cheap():
    code = "import sys, audiopipe; print(sorted(m for m in ('torch', 'pyarrow', 'ray') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_error_audiopipe_defines_derives_from_audiopipe_error():
    stray = []
    for info in pkgutil.walk_packages(ap.__path__, "audiopipe."):
        try:
            mod = importlib.import_module(info.name)
        except ImportError:  # an optional extra that is not installed (its module is tested where it is)
            continue
        for name, cls in vars(mod).items():
            if (inspect.isclass(cls) and issubclass(cls, BaseException) and not issubclass(cls, Warning)
                    and cls.__module__ == info.name
                    and f"{info.name}.{name}" not in INTERNAL and not issubclass(cls, ap.AudiopipeError)):
                stray.append(f"{info.name}.{name}")
    assert not stray, f"errors outside AudiopipeError: {stray}"


def test_ap_shard_runs_the_job_and_its_errors_are_audiopipe_errors(tmp_path):
    with pytest.raises(ap.AudiopipeError, match="shard"):
        ap.shard(tmp_path, tmp_path / "out", shard_size=-1)


def test_py_typed_marker_ships():
    assert (Path(ap.__file__).parent / "py.typed").is_file()
