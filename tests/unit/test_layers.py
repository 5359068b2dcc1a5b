"""The layer contracts (pyproject.toml [tool.importlinter], checked by `lint-imports` in
`make lint`) hold, and would catch a pure core that reaches for I/O or a layer imported upward.

Each breach below is written into a copy of the tree: the contracts must then fail, showing
the import that breaks one (directly, or the last link of a chain through other modules).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT), "--no-cache"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_the_tree_keeps_every_contract() -> None:
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


@dataclass(frozen=True, slots=True)
class Breach:
    module: str  # a file under the tree, relative
    line: str  # appended to it
    says: str  # the import chain the report must show


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            Breach("rules/plan.py", "import time", "rules.plan -> time"),
            id="a renderer that reads the clock",
        ),
        pytest.param(
            Breach(
                "agent/node/assembly.py",
                "import agent.dataplane.libnft",
                "agent.dataplane.libnft -> nftables",
            ),
            id="the node core reaching libnftables through the dataplane",
        ),
        pytest.param(
            Breach(
                "agent/kube/store.py",
                "import agent.node.assembly",
                "agent.kube.store -> agent.node.assembly",
            ),
            id="API plumbing importing the node role",
        ),
        pytest.param(
            Breach(
                "agent/announce/vrrp/machine.py",
                "import agent.kube.events",
                "agent.announce.vrrp.machine -> agent.kube.events",
            ),
            id="the VRRP machine importing the API plumbing",
        ),
        pytest.param(
            Breach("agent/model/net.py", "import rules.layout", "agent.model.net -> rules.layout"),
            id="the model importing upward (rules)",
        ),
        pytest.param(
            Breach(
                "agent/dataplane/applier.py", "import lab.netns", "is not allowed to import lab"
            ),
            id="the product importing the lab",
        ),
    ],
)
def test_a_breach_breaks_a_contract(tmp_path: Path, case: Breach) -> None:
    tree = tmp_path / "tree"
    for name in ("agent", "rules", "lab"):
        shutil.copytree(ROOT / name, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    target = tree / case.module
    target.write_text(target.read_text() + f"\n{case.line}  # noqa\n")
    result = lint(tree)
    assert result.returncode != 0, result.stdout[-2000:]
    assert case.says in result.stdout, result.stdout[-3000:]
