"""tests/file_costs.py reads a `--durations` report into the root conftest's FILE_COST_S, and that table names only
files that exist."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.file_costs import as_python, file_costs

ROOT = Path(__file__).resolve().parents[1]
REPORT = """\
============================= slowest durations ==============================
12.50s call     tests/test_b.py::test_one[x-1]
4.20s setup    tests/test_a.py::test_fleet
4.10s call     tests/test_a.py::test_fleet
0.30s teardown tests/test_a.py::test_fleet
7.99s call     sandbox/tests/test_c.py::test_short
2.01s call     resources_servers/x/tests/test_d.py::TestGroup::test_method
6.00s call     resources_servers/x/tests/test_d.py::test_other

(5 durations < 0.005s hidden.  Use -vv to show these durations.)
6787 passed in 569.64s (0:09:29)
"""


def test_a_report_is_summed_per_file_costliest_first_and_rounded_up():
    assert file_costs(REPORT) == {"tests/test_b.py": 13, "tests/test_a.py": 9,
                                  "resources_servers/x/tests/test_d.py": 9}
    assert list(file_costs(REPORT, min_s=0)) == ["tests/test_b.py", "tests/test_a.py",
                                                 "resources_servers/x/tests/test_d.py", "sandbox/tests/test_c.py"]
    assert ast.literal_eval(as_python(file_costs(REPORT)).partition("=")[2].strip()) == file_costs(REPORT)


def test_the_command_prints_the_table_or_says_why_not(tmp_path):
    report = tmp_path / "ci.log"
    report.write_text(REPORT)
    done = subprocess.run([sys.executable, "tests/file_costs.py", str(report)], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    assert done.stdout.startswith("FILE_COST_S = {\n") and '"tests/test_b.py": 13,' in done.stdout
    report.write_text("6787 passed in 569.64s\n")
    refused = subprocess.run([sys.executable, "tests/file_costs.py", str(report)], cwd=ROOT, capture_output=True,
                             text=True)
    assert refused.returncode == 2 and "--durations=0" in refused.stderr


def test_every_file_the_conftest_costs_exists():
    tree = ast.parse((ROOT / "conftest.py").read_text())
    (table,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
                and [getattr(target, "id", None) for target in node.targets] == ["FILE_COST_S"]]
    costs = ast.literal_eval(table)
    assert len(costs) > 10
    missing = [path for path in costs if not (ROOT / path).is_file()]
    assert not missing, f"renamed or removed: {missing}; refresh FILE_COST_S (python tests/file_costs.py ci.log)"

