"""Static checks of deploy/Containerfile: what it promises can be read off its instructions.

No image is built here (no container runtime or registry in the test environment). The
file is parsed as the builder reads it — comments dropped, backslash continuations joined,
instructions split into stages at FROM — and checked: a Debian bookworm base with explicit,
non-`latest` tags, apt lists removed in the layer that fetched them, the packages the agent
needs in the final image, every COPY source present in the repo and not filtered out by the
build-context ignore file, a non-root USER equal to the controller's runAsUser, and an
entrypoint that is the project's console script.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "deploy" / "Containerfile"
IGNOREFILE = ROOT / "deploy" / "Containerfile.dockerignore"
DEBIAN = re.compile(r"^(?:docker\.io/)?(?:library/)?debian:bookworm(?:-slim)?$")
KNOWN = {
    "FROM",
    "RUN",
    "COPY",
    "ADD",
    "ENV",
    "ARG",
    "LABEL",
    "USER",
    "WORKDIR",
    "ENTRYPOINT",
    "CMD",
    "EXPOSE",
    "VOLUME",
    "SHELL",
    "STOPSIGNAL",
    "HEALTHCHECK",
}
RUNTIME_PACKAGES = {"python3", "libnftables1", "python3-nftables", "iproute2", "conntrack"}


@dataclass(frozen=True, slots=True)
class Instruction:
    """One instruction: its first line number, upper-case keyword and argument text."""

    line: int
    keyword: str
    args: str


@dataclass(frozen=True, slots=True)
class Stage:
    """A build stage: its base image, its `AS` name ("" if none) and its instructions."""

    base: str
    name: str
    instructions: tuple[Instruction, ...]

    def all(self, keyword: str) -> list[Instruction]:
        """Return the stage's instructions with `keyword`, in order."""
        return [i for i in self.instructions if i.keyword == keyword]


def parse(text: str) -> list[Instruction]:
    """Return the instructions of a Containerfile (comments dropped, continuations joined)."""
    out: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue  # comment lines vanish, even inside a continued instruction
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        joined = " ".join(pending)
        pending = []
        keyword, _, args = joined.partition(" ")
        out.append(Instruction(start, keyword.upper(), args.strip()))
    assert not pending, "the file ends inside a continued instruction"
    return out


def stages(instructions: list[Instruction]) -> list[Stage]:
    """Return the build stages; instructions before the first FROM are not allowed."""
    result: list[Stage] = []
    current: list[Instruction] = []
    base = name = ""
    for ins in instructions:
        if ins.keyword == "FROM":
            if base:
                result.append(Stage(base, name, tuple(current)))
            words = [w for w in ins.args.split() if not w.startswith("--platform")]
            base = words[0]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else ""
            current = []
        else:
            assert base, f"line {ins.line}: {ins.keyword} before the first FROM"
            current.append(ins)
    result.append(Stage(base, name, tuple(current)))
    return result


def copy_parts(ins: Instruction) -> tuple[dict[str, str], list[str], str]:
    """Return (--flags, sources, destination) of a COPY or ADD instruction."""
    words = json.loads(ins.args) if ins.args.startswith("[") else shlex.split(ins.args)
    flags = {}
    while words and words[0].startswith("--"):
        key, _, value = words.pop(0)[2:].partition("=")
        flags[key] = value
    return flags, words[:-1], words[-1]


def commands(run: Instruction) -> list[list[str]]:
    """Return the shell commands of a RUN (split at &&), each as words."""
    return [shlex.split(part) for part in run.args.split("&&")]


INSTRUCTIONS = parse(CONTAINERFILE.read_text())
STAGES = stages(INSTRUCTIONS)
FINAL = STAGES[-1]


def pyproject() -> dict[str, Any]:
    """Return the parsed pyproject.toml."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def manifests() -> list[dict[str, Any]]:
    """Return the documents of deploy/daemonset.yaml."""
    return [d for d in yaml.safe_load_all((ROOT / "deploy" / "daemonset.yaml").read_text()) if d]


# -- the parser itself ------------------------------------------------------------------------


def test_parser_joins_continuations_and_drops_comments() -> None:
    text = "FROM a:1 AS b\n# note\nRUN x \\\n  # inner\n  && y\nUSER 1\n"
    assert parse(text) == [
        Instruction(1, "FROM", "a:1 AS b"),
        Instruction(3, "RUN", "x && y"),
        Instruction(6, "USER", "1"),
    ]
    (stage,) = stages(parse(text))
    assert (stage.base, stage.name, len(stage.instructions)) == ("a:1", "b", 2)


# -- the file ---------------------------------------------------------------------------------


def test_every_instruction_is_a_known_one() -> None:
    unknown = [(i.line, i.keyword) for i in INSTRUCTIONS if i.keyword not in KNOWN]
    assert unknown == []


def test_every_stage_builds_on_debian_bookworm_with_an_explicit_tag() -> None:
    names: set[str] = set()
    for stage in STAGES:
        if stage.base in names:
            continue  # FROM an earlier stage
        assert DEBIAN.match(stage.base), f"{stage.base} is not Debian bookworm"
        assert ":" in stage.base and not stage.base.endswith(":latest")
        if stage.name:
            names.add(stage.name)
    assert len(STAGES) >= 2, "build tools stay out of the runtime image"


def test_no_instruction_refers_to_a_latest_tag() -> None:
    assert [i.line for i in INSTRUCTIONS if re.search(r":latest\b", i.args)] == []


def test_apt_installs_fetch_lists_skip_recommends_and_clean_up_in_one_layer() -> None:
    installs = [r for r in INSTRUCTIONS if r.keyword == "RUN" and "apt-get install" in r.args]
    assert installs
    for run in installs:
        cmds = commands(run)
        update = next(i for i, c in enumerate(cmds) if c[:2] == ["apt-get", "update"])
        install = next(i for i, c in enumerate(cmds) if c[:2] == ["apt-get", "install"])
        assert update < install, f"line {run.line}: apt-get update must precede install"
        assert {"-y", "--no-install-recommends"} <= set(cmds[install])
        assert cmds[-1] == ["rm", "-rf", "/var/lib/apt/lists/*"], f"line {run.line}"


def apt_packages(stage: Stage) -> set[str]:
    """Return the packages a stage installs with apt-get install."""
    found: set[str] = set()
    for run in stage.all("RUN"):
        for cmd in commands(run):
            if cmd[:2] == ["apt-get", "install"]:
                found |= {w for w in cmd[2:] if not w.startswith("-")}
    return found


def test_runtime_image_has_python_libnftables_its_bindings_ip_and_conntrack() -> None:
    assert RUNTIME_PACKAGES - apt_packages(FINAL) == set()
    # The bindings are Debian's: the virtualenv must see the system site-packages.
    venvs = [c for r in INSTRUCTIONS if r.keyword == "RUN" for c in commands(r) if "venv" in c]
    assert venvs and all("--system-site-packages" in c for c in venvs)
    # Debian bookworm ships Python 3.11, which the project must accept.
    assert pyproject()["project"]["requires-python"] == ">=3.11"


def ignored_roots() -> tuple[bool, set[str]]:
    """Return (everything excluded by default, the paths re-included with `!`)."""
    lines = [
        line.strip()
        for line in IGNOREFILE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return lines[0] == "*", {line[1:].rstrip("/") for line in lines if line.startswith("!")}


def test_every_copy_source_exists_in_the_repo_and_reaches_the_build_context() -> None:
    excludes_all, included = ignored_roots()
    assert excludes_all, "the ignore file starts from nothing and adds what is copied"
    sources: set[str] = set()
    for ins in INSTRUCTIONS:
        if ins.keyword not in ("COPY", "ADD"):
            continue
        flags, srcs, _ = copy_parts(ins)
        assert ins.keyword == "COPY", f"line {ins.line}: use COPY, not ADD"
        if "from" in flags:
            assert flags["from"] in {s.name for s in STAGES if s.name}, f"line {ins.line}"
            continue
        for src in srcs:
            assert (ROOT / src).exists(), f"line {ins.line}: {src} is not in the repo"
            sources.add(src.rstrip("/"))
    assert sources == included, "copy sources and the ignore file's re-included paths differ"


def test_the_installed_project_is_the_copied_source_with_every_file_it_needs() -> None:
    destinations = {
        src.rstrip("/"): dest
        for ins in INSTRUCTIONS
        if ins.keyword == "COPY"
        for flags, srcs, dest in [copy_parts(ins)]
        if "from" not in flags
        for src in srcs
    }
    project_dir = destinations["pyproject.toml"].rstrip("/")
    # Packages named in pyproject and the readme it references are copied next to it.
    packages = {
        p.rstrip("*") for p in pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    for needed in {*packages, pyproject()["project"]["readme"]}:
        dest = destinations.get(needed)
        assert dest is not None, f"{needed} is not copied"
        assert dest.rstrip("/") in (project_dir, f"{project_dir}/{needed}")
    pip = [c for r in INSTRUCTIONS if r.keyword == "RUN" for c in commands(r) if "install" in c]
    assert any(c[0].endswith("/pip") and c[-1] == project_dir for c in pip)


def test_runtime_user_is_non_root_and_is_the_controllers_run_as_user() -> None:
    users = FINAL.all("USER")
    assert users, "the final stage sets USER"
    uid, _, gid = users[-1].args.partition(":")
    assert uid.isdigit() and int(uid) != 0, "numeric, so runAsNonRoot can verify it"
    (deployment,) = (d for d in manifests() if d["kind"] == "Deployment")
    security = deployment["spec"]["template"]["spec"]["securityContext"]
    assert security["runAsUser"] == int(uid)
    assert security["runAsGroup"] == int(gid or uid)
    useradd = [c for r in FINAL.all("RUN") for c in commands(r) if c[0] == "useradd"]
    assert useradd and useradd[0][useradd[0].index("--uid") + 1] == uid


def test_entrypoint_is_the_projects_console_script_and_matches_the_image_tag() -> None:
    (entrypoint,) = FINAL.all("ENTRYPOINT")
    argv = json.loads(entrypoint.args)  # exec form: signals reach nodelb, not a shell
    assert argv == ["nodelb"]
    assert "nodelb" in pyproject()["project"]["scripts"]
    version = pyproject()["project"]["version"]
    labels = " ".join(i.args for i in FINAL.all("LABEL"))
    assert f'org.opencontainers.image.version="{version}"' in labels
    images = {
        c["image"]
        for d in manifests()
        if d["kind"] in ("DaemonSet", "Deployment")
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {f"ghcr.io/nodelb/nodelb:{version}"}


@pytest.mark.parametrize("keyword", ["ENTRYPOINT", "CMD"])
def test_entrypoint_and_cmd_use_the_exec_form(keyword: str) -> None:
    for ins in FINAL.all(keyword):
        assert isinstance(json.loads(ins.args), list), f"line {ins.line}"
