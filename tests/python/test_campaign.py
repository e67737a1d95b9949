"""A small, fast slice of the damage and kill campaign (scripts/campaign.py, `make campaign`), so
the script cannot rot: a few dozen damaged stores of every layout read with the plain build
(the full campaign reads them under ASan + UBSan) and a few SIGKILLed writers (synth and both convert paths). Its oracles are
the script's: the undamaged store's values, zarr-python's reading of the damaged arrays,
h5py's reading of a damaged .h5ad, and byte-identical restarts of a killed convert.
"""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO


def test_campaign_slice_finds_nothing(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "campaign.py"), "--seed", "7",
                        "--cases", "40", "--kills", "4", "--http-every", "0", "--plain",
                        "--work", str(tmp_path)], capture_output=True, text=True, timeout=600)
    report = json.loads((tmp_path / "report.json").read_text())
    assert r.returncode == 0, (report["findings"], r.stdout[-3000:], r.stderr[-3000:])
    assert report["findings"] == []
    # every case ran through the paths and was classified; the damage reached the readers
    assert report["cases"] >= 30, report["cases"]
    paths = report["by_path"]
    assert {"info", "verify", "read_many", "loader", "read_array"} <= set(paths), paths
    assert paths["verify"].get("error", 0) > 0 and paths["read_many"].get("equal", 0) > 0, paths
    # the same seed replays the same cases
    damages = [(o["layout"], o["class"], o.get("damage")) for o in report["outcomes"]]
    assert len(damages) == report["cases"]
    kills = report["kills"]
    assert sum(kills.values()) == 4 and any(k.startswith("convert_") for k in kills), kills
