"""The shipped alerts (envoy/k8s/monitoring/prometheusrule.yaml) are valid Prometheus rules and
fire on what they are for: `promtool check rules` on the PrometheusRule's spec, then `promtool
test rules` with tests/data/prometheus_rules_test.yaml (series in, alerts with their labels and
annotations out, and quiet beside them). promtool comes from Debian's `prometheus` package, which
`make setup` installs."""
from __future__ import annotations

import shutil
import subprocess

import yaml

from harness import REPO

RULE = REPO / "envoy" / "k8s" / "monitoring" / "prometheusrule.yaml"
RULE_TESTS = REPO / "tests" / "data" / "prometheus_rules_test.yaml"


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: `make setup` installs Debian's prometheus package"
    return path


def write_rules(tmp_path) -> str:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(yaml.safe_load(RULE.read_text())["spec"]))
    return str(rules)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120)


def test_the_shipped_rules_pass_promtool_check(tmp_path):
    r = run("check", "rules", write_rules(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout, r.stdout


def test_each_operations_alert_fires_on_its_series_and_not_beside_them(tmp_path):
    rules = write_rules(tmp_path)
    tests = tmp_path / "rules_test.yaml"
    tests.write_text(RULE_TESTS.read_text().replace("  - RULES", f"  - {rules}"))
    r = run("test", "rules", str(tests))
    assert r.returncode == 0, r.stdout + r.stderr
    covered = {t["alertname"] for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
               for t in case["alert_rule_test"]}
    group = next(g for g in yaml.safe_load(RULE.read_text())["spec"]["groups"]
                 if g["name"] == "prewarm-operations")
    assert {r["alert"] for r in group["rules"]} <= covered, covered


def test_a_broken_threshold_fails_the_rule_tests(tmp_path):
    """The rule tests can fail: the stale-table alert at 600 s instead of 60 s never fires."""
    spec = yaml.safe_load(RULE.read_text())["spec"]
    for g in spec["groups"]:
        for rule in g["rules"]:
            if rule.get("alert") == "PrewarmRoutingTableStale":
                rule["expr"] = rule["expr"].replace("> 60", "> 600")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(spec))
    tests = tmp_path / "rules_test.yaml"
    tests.write_text(RULE_TESTS.read_text().replace("  - RULES", f"  - {rules}"))
    r = run("test", "rules", str(tests))
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "PrewarmRoutingTableStale" in out, out
