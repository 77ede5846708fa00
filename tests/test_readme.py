"""The README's Python blocks run as written, and its figures come from the stored results."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def python_blocks(text: str) -> list[str]:
    """Every fenced ```python block of ``text``, in order."""
    return re.findall(r"^```python\n(.*?)^```$", text, re.M | re.S)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_readme_is_a_short_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert len(python_blocks(text)) == 3  # compress a tensor, the DDP hook, a training
    assert not any("'" in block for block in python_blocks(text))  # python -c '<block>' works
    assert "make run" in text and "make test" in text
    for target in re.findall(r"\]\(((?:docs|examples)/[^)#]+)", text):
        assert (ROOT / target).exists(), target  # every link to the repository's files resolves


def test_the_readme_has_no_hand_written_measurements() -> None:
    # figures live between the generated markers (tools/performance_page.py), nowhere else
    text = re.sub(r"<!-- performance:.*?<!-- /performance -->", "", README.read_text(), flags=re.S)
    prose = re.sub(r"^```.*?^```$", "", text, flags=re.M | re.S)
    assert not re.search(
        r"\d\s*(ms|s a step|MB|Gbit|Mbit|minutes|tests\b)", prose.replace("100 Mbit/s", "")
    )


@pytest.mark.distributed
@pytest.mark.parametrize("index", range(3))
def test_every_readme_python_block_runs_as_written(index: int, tmp_path: Path) -> None:
    block = python_blocks(README.read_text())[index]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        "MASTER_PORT": str(free_port()),  # the DDP block's setdefault takes it
        "OMP_NUM_THREADS": "1",
    }
    run = subprocess.run(
        [sys.executable, "-c", block],
        cwd=tmp_path,  # the training block writes runs/ here
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip()
