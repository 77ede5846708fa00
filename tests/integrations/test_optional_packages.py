"""gradzip works without Lightning and Accelerate: ``import gradzip`` never imports them, and
the modules that need them say which package is missing and how to install it."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest


def hide(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    """Make ``import package`` (and its submodules, also those already imported) fail."""
    for name in [name for name in sys.modules if name.split(".")[0] == package] + [package]:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize(
    ("module", "package"),
    [
        ("gradzip.integrations.lightning", "lightning"),
        ("gradzip.integrations.accelerate", "accelerate"),
    ],
)
def test_a_missing_framework_is_named(
    monkeypatch: pytest.MonkeyPatch, module: str, package: str
) -> None:
    hide(monkeypatch, package)
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(
        ImportError, match=rf"needs the '{package}' package.*gradzip\[integrations\]"
    ):
        importlib.import_module(module)


@pytest.mark.distributed  # a fresh interpreter: what `import gradzip` loads
def test_importing_gradzip_imports_neither_framework() -> None:
    code = (
        "import sys, gradzip, gradzip.integrations; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'lightning', 'accelerate'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
