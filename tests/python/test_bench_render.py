"""`frigg bench render`: rows measured on different machines never share one machine line."""

import copy
import json
import subprocess
import tempfile
from pathlib import Path

from harness import FRIGG, ROOT


def render(tmp: Path, kind: str, reports: list) -> subprocess.CompletedProcess:
    files = []
    for i, r in enumerate(reports):
        f = tmp / f"r{i}.json"
        f.write_text(json.dumps(r))
        files.append(str(f))
    md = tmp / "out.md"
    md.write_text("<!-- bench:t:begin -->\n<!-- bench:t:end -->\n")
    p = subprocess.run([FRIGG, "bench", "render", f"--{kind}", *files, "--markdown", str(md), "--key", "t"], capture_output=True, text=True, timeout=60)
    p.md = md.read_text()
    return p


def test_matrix_rows_of_two_machines_get_a_table_each():
    cells = json.loads((ROOT / "docs/bench/vs-amd-epyc-avx512-q4.json").read_text())[:2]
    other = copy.deepcopy(cells)
    for c in other:
        c["machine"]["cpu"] = "Other CPU"
        c["model"] = "models/other.gguf"
    with tempfile.TemporaryDirectory() as d:
        p = render(Path(d), "matrix", [cells, other, cells])
    assert p.returncode == 0, p.stderr
    tables = p.md.split("Machine: ")[1:]
    assert len(tables) == 2, p.md
    # each machine's rows under its own line, in the order first seen
    assert not tables[0].startswith("Other CPU") and tables[0].count("| mimir-q4_0.gguf |") == 4, tables[0]
    assert tables[1].startswith("Other CPU") and tables[1].count("| other.gguf |") == 2, tables[1]


def test_load_runs_of_two_machines_are_refused():
    run = json.loads((ROOT / "docs/bench/load-tiny.json").read_text())
    other = copy.deepcopy(run)
    other["machine"]["cpu"] = "Other CPU"
    with tempfile.TemporaryDirectory() as d:
        p = render(Path(d), "load", [run, other])
    assert p.returncode != 0 and "another machine" in p.stderr, (p.returncode, p.stderr)
