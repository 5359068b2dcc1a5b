"""deploy/ monitoring artifacts: alert rules, their promtool tests, the Grafana dashboard, docs.

promtool is the real one, built pinned by scripts/build-promtool.sh (versions-promtool.env)
into ~/.cache/nodelb/promtool/<version>/; `make test` builds it first. Every check that
promtool passes is paired with a broken copy that promtool must refuse, so a promtool that
accepts anything fails the suite.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

import agent.controller.metrics  # registers the controller's metrics
import agent.dataplane.metrics
import agent.kube.metrics
import agent.node.metrics  # noqa: F401  (registers the agent's metrics)
from agent.announce.metrics import SpeakerMetrics
from lab import binaries

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus-rules.yaml"
RULES_TEST = REPO / "deploy" / "prometheus-rules.test.yaml"
DASHBOARD = REPO / "deploy" / "grafana-dashboard.json"
METRICS_DOC = REPO / "docs" / "metrics.md"
PROMTOOL_TIMEOUT = 60.0

# Values the dashboard's variables take when its queries are checked.
GRAFANA_SUBSTITUTIONS = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$node": ".*",
    "$pool": ".*",
}
# Alerts the issue asks for; the rule file may have more, never fewer.
REQUIRED_ALERTS = {
    "NodelbPoolNearlyFull",
    "NodelbSyncFailures",
    "NodelbHolderFlapping",
    "NodelbIPWithoutHolder",
    "NodelbControllerNoLeader",
    "NodelbConfigRefused",
    "NodelbAgentDown",
}
# Metrics the dashboard must chart (one or more panels each).
REQUIRED_DASHBOARD_METRICS = {
    "nodelb_sync_duration_seconds",
    "nodelb_programmed_frontends",
    "nodelb_programmed_map_elements",
    "nodelb_pool_addresses",
    "nodelb_pool_addresses_in_use",
    "nodelb_vrrp_state",
    "nodelb_vrrp_takeovers_total",
    "nodelb_gratuitous_sent_total",
    "nodelb_vrrp_adverts_sent_total",
    "nodelb_vrrp_adverts_received_total",
    "nodelb_vrrp_adverts_dropped_total",
    "nodelb_nft_transaction_failures_total",
    "nodelb_external_ips_refused_total",
    "nodelb_watch_restarts_total",
    "nodelb_allocations_total",
    "nodelb_reallocations_total",
    "nodelb_status_writes_total",
    "nodelb_service_ips_unheld",
}
_METRIC = re.compile(r"\bnodelb_[a-z0-9_]+")
_HISTOGRAM_SUFFIX = re.compile(r"_(bucket|count|sum)$")


# -- helpers ------------------------------------------------------------------------------


def promtool_path() -> Path:
    """Return the pinned promtool's path: $PROMTOOL, else the build script's cache directory."""
    return binaries.pinned_tool(
        "promtool", versions="versions-promtool.env", key="PROMTOOL_VERSION"
    )


@pytest.fixture(scope="module")
def promtool() -> Path:
    """Return the pinned promtool binary; fails (not skips) when it was not built."""
    path = promtool_path()
    if not os.access(path, os.X_OK):
        pytest.fail(f"promtool not found at {path}: run scripts/build-promtool.sh (make test does)")
    return path


def run_promtool(
    promtool: Path, *args: str | Path, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Return promtool's result for `args` (stdout and stderr captured as text)."""
    return subprocess.run(
        [str(promtool), *map(str, args)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=PROMTOOL_TIMEOUT,
        check=False,
    )


def load_yaml(path: Path) -> Any:
    """Return the parsed YAML document at `path`."""
    return yaml.safe_load(path.read_text())


def alert_rules() -> list[dict[str, Any]]:
    """Return every alerting rule of deploy/prometheus-rules.yaml, in file order."""
    doc = load_yaml(RULES)
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def dashboard() -> dict[str, Any]:
    """Return the parsed Grafana dashboard."""
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def dashboard_panels() -> list[dict[str, Any]]:
    """Return every non-row panel of the dashboard (rows' nested panels included)."""
    out: list[dict[str, Any]] = []
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            out.extend(panel.get("panels", []))
        else:
            out.append(panel)
    return out


def dashboard_exprs() -> list[tuple[str, str]]:
    """Return (where, PromQL expression) for every panel target, variables substituted."""
    out = []
    for panel in dashboard_panels():
        for target in panel["targets"]:
            expr = target["expr"]
            for var, value in GRAFANA_SUBSTITUTIONS.items():
                expr = expr.replace(var, value)
            out.append((f"panel {panel['id']} {panel['title']!r} {target['refId']}", expr))
    return out


def metric_names(expr: str) -> set[str]:
    """Return the nodelb_ metric names an expression reads (histogram suffixes removed)."""
    return {_HISTOGRAM_SUFFIX.sub("", m) for m in _METRIC.findall(expr)}


@dataclass(frozen=True, slots=True)
class DocumentedMetric:
    """One row of a metrics table in docs/metrics.md."""

    name: str
    type: str
    labels: frozenset[str]


def documented_metrics() -> dict[str, DocumentedMetric]:
    """Return the metrics docs/metrics.md's tables list, by name."""
    rows: dict[str, DocumentedMetric] = {}
    for line in METRICS_DOC.read_text().splitlines():
        # Columns are split on unescaped pipes; `\|` inside a cell separates label values.
        m = re.match(r"^\| `(nodelb_[a-z0-9_]+)` \| (\w+) \| ((?:[^|\\]|\\\|)*) \|", line)
        if m is None:
            continue
        # "`a`, `b` = `x` \| `y`": each comma-separated part starts with a label name; what
        # follows `=` lists its values. "—" means no labels.
        parts = [p for p in m.group(3).split(",") if p.strip() not in ("", "—")]
        names = [re.match(r"\s*`([a-z_]+)`", p) for p in parts]
        assert all(names), f"{m.group(1)}: cannot read the labels cell {m.group(3)!r}"
        labels = frozenset(n.group(1) for n in names if n is not None)
        assert m.group(1) not in rows, f"{m.group(1)} is documented twice"
        rows[m.group(1)] = DocumentedMetric(m.group(1), m.group(2), labels)
    return rows


def registered_metrics() -> dict[str, DocumentedMetric]:
    """Return every nodelb_ metric the agent, announcer and controller modules register.

    Names are as Prometheus stores them: counters get `_total` (prometheus-client appends it
    to every counter sample whether or not the code wrote it).
    """
    speaker_registry = CollectorRegistry()
    SpeakerMetrics(registry=speaker_registry)
    collectors: list[Collector] = []
    for registry in (REGISTRY, speaker_registry):
        # The registry keeps no public list of its collectors; its name map is the only one.
        collectors.extend(set(registry._collector_to_names))
    out: dict[str, DocumentedMetric] = {}
    for collector in collectors:
        name = getattr(collector, "_name", "")
        kind = getattr(collector, "_type", "")
        if not name.startswith("nodelb_"):
            continue
        if kind == "counter":
            name += "_total"
        labels = frozenset(getattr(collector, "_labelnames", ()))
        out[name] = DocumentedMetric(name, kind, labels)
    return out


def exposition() -> str:
    """Return the text /metrics serves for every nodelb metric (announcer's included)."""
    speaker_registry = CollectorRegistry()
    SpeakerMetrics(registry=speaker_registry)
    return (generate_latest(REGISTRY) + generate_latest(speaker_registry)).decode()


# -- metric names -------------------------------------------------------------------------


def test_exposed_metrics_pass_promtool_check_metrics(promtool: Path) -> None:
    text = exposition()
    families = set(re.findall(r"^# TYPE (nodelb_\w+) ", text, re.M))
    assert len(families) >= 25, sorted(families)
    result = run_promtool(promtool, "check", "metrics", stdin=text)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_check_metrics_refuses_a_badly_named_counter(promtool: Path) -> None:
    text = "# HELP nodelb_bad_count Bad.\n# TYPE nodelb_bad_count counter\nnodelb_bad_count 1\n"
    result = run_promtool(promtool, "check", "metrics", stdin=text)
    assert result.returncode != 0
    assert '"_total" suffix' in result.stdout + result.stderr


def test_every_exposed_family_is_documented(documented: dict[str, DocumentedMetric]) -> None:
    # What Prometheus will store: counters as <name>_total (their <name>_created companion
    # gauges are prometheus-client's and not documented), histograms under their base name.
    text = exposition()
    exposed = {
        name
        for name, kind in re.findall(r"^# TYPE (nodelb_\w+) (\w+)$", text, re.M)
        if not (kind == "gauge" and name.endswith("_created"))
    }
    assert sorted(exposed - set(documented)) == []


# -- alert rules ----------------------------------------------------------------------------


def test_promtool_is_the_pinned_release(promtool: Path) -> None:
    version = binaries.read_versions(REPO / "versions-promtool.env")["PROMTOOL_VERSION"]
    minor, patch = version.removeprefix("v0.").split(".")
    release = f"{int(minor) // 100}.{int(minor) % 100}.{patch}"
    result = run_promtool(promtool, "--version")
    assert result.returncode == 0, result.stderr
    assert f"promtool, version {release}" in result.stdout


def test_rule_file_passes_promtool_check_rules(promtool: Path) -> None:
    result = run_promtool(promtool, "check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_every_alert_fires_and_clears_under_promtool_test_rules(promtool: Path) -> None:
    result = run_promtool(promtool, "test", "rules", RULES_TEST)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_check_rules_refuses_a_broken_expression(promtool: Path, tmp_path: Path) -> None:
    broken = tmp_path / "rules.yaml"
    broken.write_text(RULES.read_text().replace("> 0.9", "> > 0.9", 1))
    result = run_promtool(promtool, "check", "rules", broken)
    assert result.returncode != 0
    assert "FAILED" in result.stdout + result.stderr


def test_promtool_test_rules_fails_when_an_alert_no_longer_fires(
    promtool: Path, tmp_path: Path
) -> None:
    # Same tests, but the pool alert's threshold raised so that a full pool no longer fires:
    # the firing expectation must fail, naming the alert.
    (tmp_path / "prometheus-rules.yaml").write_text(
        RULES.read_text().replace(") > 0.9", ") > 1.5", 1)
    )
    shutil.copy(RULES_TEST, tmp_path / "prometheus-rules.test.yaml")
    result = run_promtool(promtool, "test", "rules", tmp_path / "prometheus-rules.test.yaml")
    assert result.returncode != 0
    assert "NodelbPoolNearlyFull" in result.stdout + result.stderr


def test_required_alerts_exist_with_severity_and_annotations() -> None:
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)), f"duplicate alert names: {names}"
    assert set(names) >= REQUIRED_ALERTS, f"missing: {REQUIRED_ALERTS - set(names)}"
    problems = []
    for rule in rules:
        if rule.get("labels", {}).get("severity") not in {"warning", "critical"}:
            problems.append(f"{rule['alert']}: severity must be warning or critical")
        for key in ("summary", "description"):
            if not rule.get("annotations", {}).get(key, "").strip():
                problems.append(f"{rule['alert']}: no {key} annotation")
    assert not problems, "\n".join(problems)


def _evals_by_alert() -> dict[str, list[tuple[int, str, bool]]]:
    """Return, per alert, (test group index, eval_time, expects firing) for every check."""
    out: dict[str, list[tuple[int, str, bool]]] = {}
    for i, test in enumerate(load_yaml(RULES_TEST)["tests"]):
        for check in test.get("alert_rule_test", []):
            out.setdefault(check["alertname"], []).append(
                (i, check["eval_time"], bool(check["exp_alerts"]))
            )
    return out


def _minutes(duration: str) -> int:
    m = re.fullmatch(r"(\d+)m", duration)
    assert m is not None, f"eval_time {duration!r}: write test times in whole minutes"
    return int(m.group(1))


def test_every_alert_has_a_test_where_it_fires_and_a_later_time_it_does_not() -> None:
    evals = _evals_by_alert()
    problems = []
    for rule in alert_rules():
        checks = evals.get(rule["alert"], [])
        fire_then_clear = any(
            group == g2 and fires and not fires2 and _minutes(t2) > _minutes(t)
            for group, t, fires in checks
            for g2, t2, fires2 in checks
        )
        if not fire_then_clear:
            problems.append(f"{rule['alert']}: no test where it fires and later clears")
    assert not problems, "\n".join(problems)


# -- scrape configuration -------------------------------------------------------------------


def documented_scrape_config() -> dict[str, Any]:
    """Return the Prometheus configuration docs/metrics.md's Scraping section shows."""
    section = METRICS_DOC.read_text().split("\n## Scraping\n", 1)[1].split("\n## ", 1)[0]
    m = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert m is not None, "docs/metrics.md: no yaml block under ## Scraping"
    config: dict[str, Any] = yaml.safe_load(m.group(1))
    return config


def test_documented_scrape_config_and_its_rule_file_pass_promtool_check_config(
    promtool: Path, tmp_path: Path
) -> None:
    config = documented_scrape_config()
    # promtool checks that the token file exists: point it at a stand-in for the Pod's.
    token = tmp_path / "token"
    token.write_text("token\n")
    for job in config["scrape_configs"]:
        assert job["authorization"]["credentials_file"].endswith("/serviceaccount/token")
        job["authorization"]["credentials_file"] = str(token)
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    shutil.copy(RULES, tmp_path / "prometheus-rules.yaml")
    result = run_promtool(promtool, "check", "config", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_promtool_check_config_refuses_a_broken_scrape_config(
    promtool: Path, tmp_path: Path
) -> None:
    config = documented_scrape_config()
    config["scrape_configs"][0]["kubernetes_sd_configs"][0]["role"] = "pods"  # not a role
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    shutil.copy(RULES, tmp_path / "prometheus-rules.yaml")
    result = run_promtool(promtool, "check", "config", path)
    assert result.returncode != 0
    assert 'unknown Kubernetes SD role "pods"' in result.stdout + result.stderr


def test_rules_select_the_jobs_the_scrape_config_defines() -> None:
    jobs = {job["job_name"] for job in documented_scrape_config()["scrape_configs"]}
    used = {j for rule in alert_rules() for j in re.findall(r'job="([^"]+)"', rule["expr"])}
    assert used, "no rule selects a job"
    assert used <= jobs, f"rules select jobs no scrape config defines: {used - jobs}"


# -- dashboard ----------------------------------------------------------------------------


def test_dashboard_queries_parse_as_promql(promtool: Path, tmp_path: Path) -> None:
    exprs = dashboard_exprs()
    assert exprs, "the dashboard has no queries"
    rules = [{"record": f"nodelb:dashboard:q{i}", "expr": e} for i, (_, e) in enumerate(exprs)]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = run_promtool(promtool, "check", "rules", path)
    if result.returncode != 0:
        # Say which panel: check each query alone.
        bad = []
        for where, expr in exprs:
            one = tmp_path / "one.yaml"
            one.write_text(
                yaml.safe_dump(
                    {"groups": [{"name": "q", "rules": [{"record": "nodelb:q", "expr": expr}]}]}
                )
            )
            r = run_promtool(promtool, "check", "rules", one)
            if r.returncode != 0:
                bad.append(f"{where}: {expr}\n{r.stdout}{r.stderr}")
        pytest.fail("dashboard queries promtool refuses:\n" + "\n".join(bad or [result.stdout]))
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_promtool_refuses_a_broken_dashboard_query(promtool: Path, tmp_path: Path) -> None:
    _, expr = dashboard_exprs()[0]
    path = tmp_path / "broken.yaml"
    rule = {"record": "nodelb:q", "expr": expr.replace("(", "((", 1)}
    path.write_text(yaml.safe_dump({"groups": [{"name": "q", "rules": [rule]}]}))
    assert run_promtool(promtool, "check", "rules", path).returncode != 0


def _expr_of(title: str) -> str:
    for panel in dashboard_panels():
        if panel["title"] == title:
            expr: str = panel["targets"][0]["expr"]
            for var, value in GRAFANA_SUBSTITUTIONS.items():
                expr = expr.replace(var, value)
            return expr
    raise KeyError(title)


def test_dashboard_state_and_pool_queries_compute_what_their_panels_show(
    promtool: Path, tmp_path: Path
) -> None:
    # Run two panels' queries on sample series: the state timeline must give 2 for Master,
    # 1 for Backup and 0 for Initialize; pool usage must use the leader's numbers only.
    state, usage = _expr_of("VRRP state per VRID"), _expr_of("Pool usage")
    (tmp_path / "rules.yaml").write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "panels",
                        "rules": [
                            {"record": "panel:vrrp_state", "expr": state},
                            {"record": "panel:pool_usage", "expr": usage},
                        ],
                    }
                ]
            }
        )
    )
    series = []
    for instance, current in (("n1", "Master"), ("n2", "Backup"), ("n3", "Initialize")):
        for s in ("Initialize", "Backup", "Master"):
            labels = f'instance="{instance}",vrid="5",family="IPv4",state="{s}"'
            series.append(
                {"series": f"nodelb_vrrp_state{{{labels}}}", "values": f"{int(s == current)}x5"}
            )
    for instance, leader, size, used in (("a", 1, 40, 10), ("b", 0, 40, 39)):
        series += [
            {
                "series": f'nodelb_controller_leader{{instance="{instance}"}}',
                "values": f"{leader}x5",
            },
            {
                "series": f'nodelb_pool_addresses{{instance="{instance}",pool="p",family="IPv4"}}',
                "values": f"{size}x5",
            },
            {
                "series": (
                    f'nodelb_pool_addresses_in_use{{instance="{instance}",pool="p",family="IPv4"}}'
                ),
                "values": f"{used}x5",
            },
        ]
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": "panel:vrrp_state",
                        "eval_time": "3m",
                        "exp_samples": [
                            {
                                "labels": (
                                    f'panel:vrrp_state{{instance="{i}",vrid="5",family="IPv4"}}'
                                ),
                                "value": v,
                            }
                            for i, v in (("n1", 2), ("n2", 1), ("n3", 0))
                        ],
                    },
                    {
                        "expr": "panel:pool_usage",
                        "eval_time": "3m",
                        "exp_samples": [
                            {"labels": 'panel:pool_usage{pool="p",family="IPv4"}', "value": 0.25}
                        ],
                    },
                ],
            }
        ],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    result = run_promtool(promtool, "test", "rules", tmp_path / "tests.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_structure() -> None:
    dash = dashboard()
    assert dash["schemaVersion"] >= 39
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name, metric in (("node", "nodelb_"), ("pool", "nodelb_pool_addresses")):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"]["uid"] == "${datasource}"
        assert metric in variables[name]["query"]["query"]
    ids = [p["id"] for p in dash["panels"]] + [
        p["id"] for row in dash["panels"] for p in row.get("panels", [])
    ]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {sorted(ids)}"
    problems = []
    boxes: list[tuple[str, int, int, int, int]] = []
    for panel in dash["panels"]:
        grid = panel.get("gridPos")
        if not grid or not {"h", "w", "x", "y"} <= set(grid):
            problems.append(f"panel {panel['id']}: gridPos needs h, w, x, y")
            continue
        if grid["x"] + grid["w"] > 24:
            problems.append(f"panel {panel['id']}: wider than the 24-column grid")
        boxes.append((panel["title"], grid["x"], grid["y"], grid["w"], grid["h"]))
    for i, (t1, x1, y1, w1, h1) in enumerate(boxes):
        for t2, x2, y2, w2, h2 in boxes[i + 1 :]:
            if x1 < x2 + w2 and x2 < x1 + w1 and y1 < y2 + h2 and y2 < y1 + h1:
                problems.append(f"panels {t1!r} and {t2!r} overlap")
    for panel in dashboard_panels():
        if panel.get("datasource", {}).get("uid") != "${datasource}":
            problems.append(f"panel {panel['id']}: datasource is not ${{datasource}}")
        if not panel.get("targets"):
            problems.append(f"panel {panel['id']}: no queries")
        for target in panel.get("targets", []):
            if target.get("datasource", {}).get("uid") != "${datasource}":
                problems.append(f"panel {panel['id']} {target['refId']}: datasource")
    assert not problems, "\n".join(problems)


def test_dashboard_charts_every_required_metric() -> None:
    charted = set().union(*(metric_names(e) for _, e in dashboard_exprs()))
    assert charted >= REQUIRED_DASHBOARD_METRICS, REQUIRED_DASHBOARD_METRICS - charted


def test_vrrp_state_panel_is_a_state_timeline_with_named_states() -> None:
    panel = next(p for p in dashboard_panels() if p["title"] == "VRRP state per VRID")
    assert panel["type"] == "state-timeline"
    (mapping,) = panel["fieldConfig"]["defaults"]["mappings"]
    names = {k: v["text"] for k, v in mapping["options"].items()}
    assert names == {"0": "Initialize", "1": "Backup", "2": "Master"}


# -- docs/metrics.md ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def documented() -> Iterator[dict[str, DocumentedMetric]]:
    """Return the metrics docs/metrics.md documents."""
    yield documented_metrics()


def test_every_metric_the_rules_and_dashboard_use_is_documented(
    documented: dict[str, DocumentedMetric],
) -> None:
    used = {m: "dashboard" for _, e in dashboard_exprs() for m in metric_names(e)}
    for rule in alert_rules():
        used.update({m: f"alert {rule['alert']}" for m in metric_names(rule["expr"])})
    missing = sorted(f"{m} (used by {where})" for m, where in used.items() if m not in documented)
    assert not missing, "not in docs/metrics.md:\n" + "\n".join(missing)


def test_every_registered_metric_is_documented_with_its_type_and_labels(
    documented: dict[str, DocumentedMetric],
) -> None:
    registered = registered_metrics()
    # The agent's own module alone registers a dozen; an empty walk would prove nothing.
    assert len(registered) >= 25, sorted(registered)
    problems = []
    for name, metric in sorted(registered.items()):
        doc = documented.get(name)
        if doc is None:
            problems.append(f"{name}: not documented")
            continue
        if doc.type != metric.type:
            problems.append(f"{name}: documented as {doc.type}, registered as {metric.type}")
        if doc.labels != metric.labels:
            documented_labels, code_labels = sorted(doc.labels), sorted(metric.labels)
            problems.append(f"{name}: labels {documented_labels} documented, {code_labels} in code")
    assert not problems, "docs/metrics.md disagrees with the code:\n" + "\n".join(problems)


def test_every_documented_alert_and_panel_exists(documented: dict[str, DocumentedMetric]) -> None:
    text = METRICS_DOC.read_text()
    alerts = {r["alert"] for r in alert_rules()}
    named_alerts = set(re.findall(r"\*\*(Nodelb\w+)\*\*", text)) | set(
        re.findall(r"^\| `(Nodelb\w+)` \|", text, re.M)
    )
    assert named_alerts == alerts, f"docs vs rules: {named_alerts ^ alerts}"
    titles = {p["title"] for p in dashboard_panels()}
    # Panels are named in italics (*Title*), alerts in bold (**Name**).
    named_panels = {
        " ".join(name.split()) for name in re.findall(r"(?<!\*)\*([^*\s][^*]*?)\*(?!\*)", text)
    }
    assert titles <= named_panels, f"panels the docs do not describe: {titles - named_panels}"
    assert named_panels <= titles, (
        f"panels the docs name that do not exist: {named_panels - titles}"
    )
