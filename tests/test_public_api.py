"""`import audiopipe as ap`: every name in __all__ resolves, errors share one base, the package is typed."""

import subprocess
import sys
from pathlib import Path

import audiopipe as ap


def test_every_public_name_resolves():
    for name in ap.__all__:
        assert getattr(ap, name) is not None, name
    assert ap.make_loader.__module__ == "audiopipe.reader.loader"


def test_unknown_name_is_an_attribute_error():
    try:
        ap.no_such_name
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("ap.no_such_name resolved")


def test_import_is_cheap():
    # `import audiopipe` must not pull torch in: names load on first use
    code = "import sys, audiopipe; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_py_typed_marker_ships():
    assert (Path(ap.__file__).parent / "py.typed").is_file()

