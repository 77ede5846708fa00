"""Codec speeds and timed figures of the scaling model, written to and read from JSON, so that
one measurement on a quiet machine serves every later projection (timings on a loaded machine
are slow by the load's factor; payload sizes are measured again every run, they never vary).

Two formats are read: this module's own (``"project_speeds"``: every codec's seconds a
coordinate by its label, and the timed error feedback, cast and PowerSGD figures) and
``gradzip bench codecs --json`` (``"codecs"``: encode/decode GB/s by compressor name; [CHOICE]
used for every parameter setting of that compressor).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gradzip_lab.bench.project_variants import Workload


def load_speeds(path: str | Path, work: Workload) -> None:
    """Put the speeds of ``path`` into ``work`` (``ValueError`` naming the file when it holds
    neither format)."""
    try:
        data: dict[str, Any] = json.loads(Path(path).read_text())
        if "project_speeds" in data:
            own = data["project_speeds"]
            for label, (enc, dec) in own["codecs"].items():
                work.given_speeds[label] = (float(enc), float(dec))
            work._timed.update({k: float(v) for k, v in own["timed"].items()})
        elif "codecs" in data:
            for row in data["codecs"]:
                work.given_speeds[row["name"]] = (
                    4e-9 / float(row["encode_gbps"]),
                    4e-9 / float(row["decode_gbps"]),
                )
        else:
            raise KeyError("project_speeds or codecs")
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"{path}: not a speeds file (`gradzip bench project --save-speeds` or "
            f"`gradzip bench codecs --json`): {err}"
        ) from None


def save_speeds(path: str | Path, work: Workload) -> None:
    """Write every codec speed and timed figure ``work`` has measured or read."""
    codecs = {m.label: [m.encode_s_per_coord, m.decode_s_per_coord] for m in work._codecs.values()}
    data = {"project_speeds": {"codecs": codecs, "timed": dict(work._timed)}}
    Path(path).write_text(json.dumps(data, indent=2))
