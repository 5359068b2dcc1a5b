"""Benchmark `nodelb render -f` end to end: files as kubectl prints them in, nft text out.

S Services with one EndpointSlice of E endpoints each, and two Nodes, as `kubectl get -o json`
prints them (one `kind: List` of bench.memory's objects, without managedFields as kubectl
hides them), written once as JSON and once as YAML. Each run is a fresh process (`python -m
agent.cli render --node node-1 -f FILE --config FILE`, stdout to /dev/null), timed from its
start to its exit:

- **json** — the file read with orjson (what render does with JSON);
- **yaml** — the YAML file read with libyaml's C loader;
- **reference** — the JSON file read by PyYAML's pure-Python loader, what render did before:
  the same process with the loader swapped in (`agent.kube.manifests.parse_json` replaced).

Each is run `--reps` times; the table shows the median and the fastest. The in-process parse
and render of the same objects is timed as well, to show what is left outside the parser.

    .venv/bin/python -m bench.render [--services 10000] [--endpoints 10] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import yaml

from agent.config_file import load_config
from agent.kube.manifests import load_files
from agent.node.cluster_state import ClusterState, Dirty, listed
from bench.e2e_latency import base_endpoints
from bench.memory import node_object, service_object, slice_object
from lab.topology import LB_RANGE4
from rules.render import render

ROOT = Path(__file__).resolve().parents[1]
NODES = 2

# The reference: render as it was, every file read by PyYAML's pure-Python loader.
REFERENCE = """\
import sys
import yaml
from agent.kube import manifests
manifests.parse_json = lambda data, source: manifests.parse_yaml(
    data, source, loader=yaml.SafeLoader
)
from agent.cli import main
sys.exit(main(sys.argv[1:]))
"""


def objects(services: int, endpoints: int) -> dict[str, Any]:
    """Return the `kind: List` kubectl prints for the Services, slices and Nodes."""
    items: list[dict[str, Any]] = []
    for i in range(services):
        items.append(service_object(i, 1000 + i))
        items.append(slice_object(i, 1000 + i, base_endpoints(i, endpoints, NODES)))
    items += [node_object(k) for k in range(1, NODES + 1)]
    for item in items:
        item["metadata"].pop("managedFields", None)  # kubectl hides them unless asked
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}


def run(argv: list[str], env: dict[str, str]) -> float:
    """Return the seconds process `argv` took, start to exit (it must succeed)."""
    t0 = time.monotonic()
    proc = subprocess.run(
        argv, check=False, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    took = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed: {proc.stderr.decode()[-2000:]}")
    return took


def in_process(path: Path, config: Path) -> dict[str, float]:
    """Return the seconds of the parse and of the render proper, in this process."""
    t0 = time.monotonic()
    objs = load_files([path])
    t1 = time.monotonic()
    state = ClusterState(load_config(config, node_name="node-1"))
    state.apply(
        listed(
            services=objs.get("Service", []),
            slices=objs.get("EndpointSlice", []),
            nodes=objs.get("Node", []),
        )
    )
    text = render(state.recompute(Dirty(everything=True)).desired).text()
    t2 = time.monotonic()
    assert text
    return {"parse_s": t1 - t0, "render_s": t2 - t1}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--services", type=int, default=10000)
    p.add_argument("--endpoints", type=int, default=10)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--reference-reps", type=int, default=1, help="runs of the slow reference")
    args = p.parse_args(argv)
    figures: dict[str, Any] = {
        "bench": "render",
        "services": args.services,
        "endpoints": args.endpoints,
        "cpus": os.cpu_count(),
        "libyaml": hasattr(yaml, "CSafeLoader"),
    }
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    with tempfile.TemporaryDirectory(prefix="nodelb-render-") as tmp:
        work = Path(tmp)
        doc = objects(args.services, args.endpoints)
        as_json, as_yaml, config = work / "state.json", work / "state.yaml", work / "config.yaml"
        as_json.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        as_yaml.write_text(yaml.dump(doc, Dumper=yaml.CSafeDumper, sort_keys=False))
        pool = f"{LB_RANGE4[0]}-{LB_RANGE4[1]}"
        config.write_text(yaml.safe_dump({"pools": [{"name": "bench", "addresses": [pool]}]}))
        figures["json_mb"] = as_json.stat().st_size / 1e6
        figures["yaml_mb"] = as_yaml.stat().st_size / 1e6
        tail = ["render", "--node", "node-1", "--config", str(config), "-f"]
        cli = [sys.executable, "-m", "agent.cli", *tail]
        reference = [sys.executable, "-c", REFERENCE, *tail]
        runs = {
            "json": [run([*cli, str(as_json)], env) for _ in range(args.reps)],
            "yaml": [run([*cli, str(as_yaml)], env) for _ in range(args.reps)],
            "reference": [run([*reference, str(as_json)], env) for _ in range(args.reference_reps)],
        }
        figures |= in_process(as_json, config)
    for name, times in runs.items():
        figures[f"{name}_median_s"] = statistics.median(times)
        figures[f"{name}_min_s"] = min(times)
    ref = figures["reference_median_s"]
    print(f"# {args.services} Services x {args.endpoints} endpoints", file=sys.stderr)
    print(f"{'input':<36} {'runs':>4} {'median s':>9} {'min s':>8} {'vs reference':>13}")
    labels = {
        "json": f"JSON, orjson ({figures['json_mb']:.0f} MB)",
        "yaml": f"YAML, libyaml C loader ({figures['yaml_mb']:.0f} MB)",
        "reference": "JSON, PyYAML pure Python (before)",
    }
    for name, times in runs.items():
        median = figures[f"{name}_median_s"]
        print(
            f"{labels[name]:<36} {len(times):>4} {median:>9.2f} {min(times):>8.2f}"
            f" {ref / median:>12.1f}x"
        )
    print(
        f"in process (JSON): parse {figures['parse_s']:.2f} s, render {figures['render_s']:.2f} s"
    )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
