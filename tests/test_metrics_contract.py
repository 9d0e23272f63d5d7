"""The dashboards' contract: every metric's name, type, help text and label names, as
``/metrics`` shows them, parsed by prometheus_client's own parser and pinned in
tests/data/metrics_contract.json. A change here breaks someone's dashboard or alert:
update the file only on purpose (and say so in the changelog).

Regenerate: ``FUNNEL_WRITE_CONTRACT=1 python -m pytest tests/test_metrics_contract.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from engine.service.metrics import HELP, Metrics

CONTRACT = Path(__file__).resolve().parent / "data" / "metrics_contract.json"


def _families(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        labels = sorted({k for s in family.samples for k in s.labels if k not in ("le",)})
        out[family.name] = {"type": family.type, "help": family.documentation,
                            "labels": labels, "samples": sorted({s.name for s in family.samples})}
    return out


def test_names_types_help_and_labels_are_pinned() -> None:
    metrics = Metrics()
    metrics.declare("puramur", ["greeting", "discovery"], telegram=True)
    # The families that appear only once something happened, with their labels.
    metrics.observe("funnel_turn_duration_seconds", 0.2, funnel="puramur", stage="greeting")
    metrics.observe("funnel_model_seconds", 0.1, funnel="puramur", stage="greeting")
    # Labels as the engine's calls give them (engine/service/metrics.py, telegram/, retention).
    metrics.inc("funnel_handoffs_total", funnel="puramur", stage="handoff")
    metrics.inc("funnel_stage_transitions_total", funnel="puramur", from_stage="greeting",
                to_stage="discovery")
    metrics.count("funnel_telegram_updates_total", funnel="puramur", kind="text")
    metrics.count("funnel_conversions_total", funnel="puramur")
    metrics.count("funnel_facts_refused_total", funnel="puramur", kind="ungrounded",
                  claim="customer.name")
    metrics.count("funnel_actions_refused_total", funnel="puramur", stage="handoff",
                  action="request_handoff")
    metrics.count("funnel_inbound_recovered_total", funnel="puramur", channel="telegram")
    metrics.count("funnel_telegram_start_payloads_dropped_total", funnel="puramur")
    metrics.count("funnel_retention_runs_total", funnel="puramur", outcome="done")
    metrics.follow_ups("puramur", [{"outcome": "sent", "stage": "cart_building"}])
    metrics.inc("funnel_retention_purged_total", 2, funnel="puramur")
    metrics.gauge("funnel_outbox_backlog", 1, funnel="puramur")
    metrics.gauge("funnel_outbox_oldest_due_seconds", 1, funnel="puramur")
    metrics.gauge("funnel_open_sessions", 1, funnel="puramur", version="1")
    metrics.version("puramur", {1})
    found = _families(metrics.render())
    if os.environ.get("FUNNEL_WRITE_CONTRACT"):
        CONTRACT.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n", "utf-8")
    assert found == json.loads(CONTRACT.read_text("utf-8"))
    # Every declared metric is shown (a family missing from the scrape is a broken panel).
    assert {n.removesuffix("_total") for n in HELP} <= set(found)
