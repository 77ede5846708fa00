"""``make docs-check`` (tools/check_site.py) fails where Chromium is missing: a check that
cannot run must not pass, or CI never renders a page."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "check_site.py"


def load_tool(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """tools/check_site.py as a module (registered: its dataclasses look themselves up)."""
    spec = importlib.util.spec_from_file_location("check_site", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "check_site", module)
    spec.loader.exec_module(module)
    return module


def test_no_chromium_fails_and_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tool = load_tool(monkeypatch)
    monkeypatch.setattr(tool, "find_browser", lambda: None)
    assert tool.main([str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert "SKIPPED" not in captured.out
    assert "no Chromium found" in captured.err and "apt-get install chromium" in captured.err
