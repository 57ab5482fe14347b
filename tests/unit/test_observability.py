"""The alert rules and the dashboard in infra/observability/ name only metrics the services export, and the
dashboard shows every one of them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, cast

import yaml
from prometheus_client import CollectorRegistry

from saga_orchestrator.infra.health import ServiceHealth
from saga_orchestrator.orchestrator.observe import SagaMetrics
from saga_orchestrator.orchestrator.signals import TableSignals

OBSERVABILITY = Path(__file__).resolve().parents[2] / "infra" / "observability"

SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "gauge": ("",), "summary": ("_sum", "_count", "_created")}
"""What prometheus_client appends to a family's name in the text format, by its type."""

_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"[A-Za-z_:][\w:]*")


def exported_names(registry: CollectorRegistry) -> dict[str, str]:
    """Every sample name ``registry`` exports, with the family it belongs to."""
    names = {}
    for family in registry.collect():
        for suffix in SUFFIXES[family.type]:
            names[family.name + suffix] = family.name
    return names


def every_service_registry() -> CollectorRegistry:
    """One registry holding what any service registers: the health of every service and the orchestrator's own."""
    health = ServiceHealth("orchestrator")
    SagaMetrics(health)
    TableSignals(cast(Any, None), health, compensation_alert_s=900)
    return health.registry


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: its identifiers, once strings, label matchers, groupings,
    range selectors, Grafana variables and function calls are taken out."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\$\w+", " ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        rest = text[match.end():].lstrip()
        if rest.startswith("(") or match.group() in ("and", "or", "unless", "bool", "offset"):
            continue  # a function, an operator
        if match.start() > 0 and (text[match.start() - 1].isdigit() or text[match.start() - 1] == "."):
            continue  # the exponent or unit of a number
        names.add(match.group())
    return names


def alert_expressions() -> dict[str, str]:
    rules = yaml.safe_load((OBSERVABILITY / "alerts.yml").read_text())
    return {rule["alert"]: rule["expr"] for group in rules["groups"] for rule in group["rules"]}


def dashboard_expressions() -> dict[str, str]:
    dashboard = json.loads((OBSERVABILITY / "dashboard.json").read_text())
    return {f"{panel['title']} {target['refId']}": target["expr"]
            for panel in dashboard["panels"] for target in panel.get("targets", [])}


def test_the_expression_parser_finds_metric_names_and_nothing_else() -> None:
    expr = ('histogram_quantile(0.99, sum by (le, saga_type) (rate(saga_step_duration_seconds_bucket'
            '{outcome="succeeded", saga_type=~"a|b"}[$__rate_interval]))) / on(step) 1e3 > bool time() - x_total')
    assert metric_names(expr) == {"saga_step_duration_seconds_bucket", "x_total"}


def test_every_alert_names_metrics_the_services_export() -> None:
    exported = exported_names(every_service_registry())
    alerts = alert_expressions()
    assert {"SagaOutboxNotDraining", "SagaConsumerLagGrowing", "SagaTimersOverdue", "SagaOldestRunningTooOld",
            "SagaCompensationRetryingLong", "SagaCompensationRateHigh"} <= alerts.keys()
    for alert, expr in alerts.items():
        names = metric_names(expr)
        assert names, f"{alert} names no metric"
        assert names <= exported.keys(), f"{alert} names {sorted(names - exported.keys())}, which nothing exports"


def test_every_dashboard_panel_names_exported_metrics_and_shows_every_metric() -> None:
    exported = exported_names(every_service_registry())
    shown: set[str] = set()
    for panel, expr in dashboard_expressions().items():
        names = metric_names(expr)
        assert names <= exported.keys(), f"panel {panel} names {sorted(names - exported.keys())}, not exported"
        shown |= {exported[name] for name in names}
    assert shown == set(exported.values()), f"the dashboard lacks {sorted(set(exported.values()) - shown)}"


def test_every_alert_says_how_urgent_it_is_and_what_to_look_at() -> None:
    rules = yaml.safe_load((OBSERVABILITY / "alerts.yml").read_text())
    for rule in (rule for group in rules["groups"] for rule in group["rules"]):
        assert rule["labels"]["severity"] in ("page", "ticket"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
