"""`nodelb` command line: agent, render, cleanup, lab."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from agent.config import ConfigError, load_config
from agent.kube.events import ListSink
from agent.manifests import ManifestError, load_files
from agent.nft import LibNftRunner
from agent.report import desired_dict
from agent.runtime import Agent, ListFns
from rules.render import RenderError, render, render_cleanup


def _no_api(**kwargs: Any) -> Any:
    raise RuntimeError("render reads files only; it never calls the API")


class _NoDataplane:
    def sync(self, desired: Any, *, full: bool = False) -> Any:
        raise RuntimeError("render never programs the kernel")

    def check_drift(self) -> bool:
        return False


def cmd_render(args: argparse.Namespace) -> int:
    """Print the full transaction (or the desired state) the agent would apply on a node."""
    cfg = load_config(args.config, node_name=args.node)
    objects = load_files(args.file)
    sink = ListSink()
    agent = Agent(
        cfg,
        dataplane=_NoDataplane(),
        events=sink,
        lists=ListFns(_no_api, _no_api, _no_api),
    )
    agent.ingest(
        services=objects.get("Service", []),
        slices=objects.get("EndpointSlice", []),
        nodes=objects.get("Node", []),
    )
    desired = agent.compute()
    for key, problems in sorted(agent.status.problems.items()):
        for p in problems:
            print(f"warning: {key}: {p.reason}: {p.message}", file=sys.stderr)
    if args.json:
        sys.stdout.write(orjson.dumps(desired_dict(desired), option=orjson.OPT_INDENT_2).decode())
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(desired).text())
    return 0


def cmd_cleanup(args: argparse.Namespace) -> int:
    """Remove the nodelb table from this network namespace (no other table is touched)."""
    LibNftRunner().run(render_cleanup().text())
    print("removed table inet nodelb (if it existed)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nodelb", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("render", help="print the nft transaction the agent would apply")
    p.add_argument("--node", required=True, help="the node to render for")
    p.add_argument("-f", "--file", type=Path, action="append", required=True)
    p.add_argument("--config", type=Path, default=None)
    p.add_argument("--json", action="store_true", help="print the desired state instead")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("cleanup", help="remove nodelb's nftables table")
    p.set_defaults(func=cmd_cleanup)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (ConfigError, ManifestError, RenderError) as exc:
        print(f"nodelb: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
