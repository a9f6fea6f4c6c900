"""The alert rules and the Grafana dashboard offsetlake ships (`offsetlake monitoring rules|dashboard`): the rules
valid (`promtool check rules`) and firing when they should and only then (`promtool test rules`, against
series named as the endpoint names them); every metric they and the dashboard read, one the endpoint exposes.
A real Prometheus scraping a real Airflow's endpoint with these rules: tests/airflow/test_airflow_ui.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import yaml

from offsetlake.airflow.metrics import CommitTotals, prometheus_text
from offsetlake.cli import main

RULES_TEST = Path(__file__).parent / "monitoring" / "offsetlake-rules-test.yml"
METRIC = re.compile(r"\boffsetlake_[a-z_]+\b")


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Prometheus' own rule checker (Debian's prometheus package, which `make` installs for the tests)."""
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def shipped(what: str, capsys) -> str:
    assert main(["monitoring", what]) == 0
    return capsys.readouterr().out


def exposed_names() -> set[str]:
    """Every sample name /offsetlake/metrics can give (a summary's as its _sum and _count)."""
    families = re.findall(r"^# TYPE (\S+) (\S+)$", prometheus_text([], CommitTotals()).decode(), flags=re.MULTILINE)
    names = set()
    for name, kind in families:
        names |= {f"{name}_sum", f"{name}_count"} if kind == "summary" else {name}
    return names


def test_the_rules_are_valid_and_fire_when_they_should_and_only_then(capsys, tmp_path):
    (tmp_path / "offsetlake-rules.yml").write_text(shipped("rules", capsys))
    shutil.copy(RULES_TEST, tmp_path)

    checked = promtool("check", "rules", "offsetlake-rules.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", RULES_TEST.name, cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_rule_is_tested_firing_and_every_metric_is_one_the_endpoint_exposes(capsys):
    rules = yaml.safe_load(shipped("rules", capsys))
    alerts = {rule["alert"]: rule for group in rules["groups"] for rule in group["rules"]}
    cases = yaml.safe_load(RULES_TEST.read_text())["tests"]
    fired = {check["alertname"] for case in cases for check in case["alert_rule_test"] if check["exp_alerts"]}
    assert fired == set(alerts)
    assert {rule["labels"]["severity"] for rule in alerts.values()} <= {"page", "ticket"}

    names = exposed_names()
    read = {name for rule in alerts.values() for name in METRIC.findall(rule["expr"])}
    fed = {METRIC.match(series["series"]).group(0) for case in cases for series in case["input_series"]}
    assert read <= names, read - names
    assert fed <= names, fed - names
    assert read == fed  # each metric a rule reads is given in its test


def test_the_dashboard_reads_only_what_the_endpoint_exposes_through_its_variables(capsys):
    dashboard = json.loads(shipped("dashboard", capsys))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    assert "offsetlake_up" in variables["pipeline"]["definition"]

    names, read = exposed_names(), set()
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]  # every number has its unit
        for target in panel["targets"]:
            assert '{pipeline=~"$pipeline"}' in target["expr"], (panel["title"], target["expr"])
            read |= set(METRIC.findall(target["expr"]))
    assert read <= names, read - names
    # what a team looks at first: lag, throughput, batch time, quarantine, failed runs
    for metric in (
        "offsetlake_pipeline_lag_records",
        "offsetlake_committed_records_total",
        "offsetlake_batch_duration_seconds_sum",
        "offsetlake_quarantined_records_total",
        "offsetlake_last_run_failed",
    ):
        assert metric in read
