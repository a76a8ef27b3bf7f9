"""``GET /metrics``: the aggregator's view in the Prometheus text exposition format (0.0.4).

Built from the provider's ``status_snapshot()`` and ``counters()`` only, so scraping never
touches the store. A run of more than ``SUMMARY_RANKS`` ranks has per-rank series only for its
odd ranks (not alive, divergent, missing or dropping records); ``rankwatch_run_ranks`` counts
every run's ranks by state. Run, rank and metric names come from the wire and are label values,
escaped as the format demands (backslash, double quote, newline).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from rankwatch.agent.wire.jsonsafe import json_number
from rankwatch.aggregator.provider import telemetry_metrics

BY_NAME = telemetry_metrics()

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "rankwatch_aggregator_"

_NAME_BAD = re.compile(r"[^a-zA-Z0-9_]")


def escape_label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def metric_name(raw: str) -> str:
    """A valid Prometheus name for a counter key: ``decode errors`` -> ``..._decode_errors``."""
    name = _NAME_BAD.sub("_", raw).strip("_") or "unnamed"
    return PREFIX + (name if not name[0].isdigit() else "_" + name)


class Exposition:
    """Collects samples grouped by metric family, then renders them with HELP and TYPE lines."""

    def __init__(self) -> None:
        self._families: dict[str, tuple[str, str, list[str]]] = {}

    def add(
        self,
        name: str,
        value: Any,
        labels: Mapping[str, object] | None = None,
        *,
        help_text: str = "",
        kind: str = "gauge",
    ) -> None:
        if isinstance(value, bool):
            value = float(value)
        if not isinstance(value, (int, float)):
            return  # a missing or non-numeric reading is simply not exported
        family = self._families.setdefault(name, (help_text, kind, []))
        label_text = ""
        if labels:
            label_text = (
                "{" + ",".join(f'{key}="{escape_label(val)}"' for key, val in labels.items()) + "}"
            )
        family[2].append(f"{name}{label_text} {format_value(float(value))}")

    def render(self) -> str:
        lines: list[str] = []
        for name, (help_text, kind, samples) in self._families.items():
            if help_text:
                lines.append(f"# HELP {name} {help_text.replace(chr(10), ' ')}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(samples)
        return "\n".join(lines) + "\n"


def _flatten(prefix: str, value: Any) -> Iterable[tuple[str, dict[str, str], Any]]:
    """Counters may nest one level (``{"decode_errors": {"field": 3}}``): nested keys become
    a ``kind`` label."""
    if isinstance(value, Mapping):
        for key, inner in value.items():
            if isinstance(inner, Mapping):
                continue  # deeper nesting is not a counter shape we know how to label
            yield prefix, {"kind": str(key)}, inner
    else:
        yield prefix, {}, value


def render(
    snapshot: Mapping[str, Any],
    counters: Mapping[str, Any],
    firing: int,
    telemetry: Mapping[str, Mapping[int, Mapping[str, Any]]] | None = None,
) -> str:
    """``telemetry``: run -> rank -> {"host", "device", "values"} (``telemetry_latest``)."""
    out = Exposition()
    _telemetry(out, telemetry or {})
    for run in snapshot.get("runs", []):
        name = run.get("run", "")
        out.add(
            "rankwatch_run_world_size",
            run.get("world_size"),
            {"run": name},
            help_text="Ranks the run was launched with.",
        )
        out.add(
            "rankwatch_run_last_step",
            run.get("last_step"),
            {"run": name},
            help_text="Highest step any rank of the run reported.",
        )
        out.add(
            "rankwatch_run_last_record_time_seconds",
            run.get("last_time"),
            {"run": name},
            help_text="Unix time of the newest record of the run.",
        )
        counts = run.get("rank_states")
        if not isinstance(counts, dict):  # every rank listed: count them here
            counts = dict(Counter(str(r.get("state")) for r in run.get("ranks") or ()))
        for state, count in sorted(counts.items()):
            out.add(
                "rankwatch_run_ranks",
                count,
                {"run": name, "state": state},
                help_text="Ranks of the run in each health state (a run of many ranks has "
                "per-rank series only for its ranks not alive, divergent or missing records).",
            )
        out.add(
            "rankwatch_run_incidents_open",
            len(run.get("incidents") or ()),
            {"run": name},
            help_text="Incidents of the run that are open (firing) now.",
        )
        for incident in run.get("incidents") or ():
            culprits = ",".join(str(r) for r in incident.get("culprits") or ())
            out.add(
                "rankwatch_incident_open",
                1,
                {
                    "run": name,
                    "incident": incident.get("id", ""),
                    "cause": incident.get("cause", ""),
                    "culprit": culprits,
                },
                help_text="1 for each open incident, with its cause and culprit rank(s).",
            )
            out.add(
                "rankwatch_incident_affected_ranks",
                len(incident.get("affected") or ()),
                {"run": name, "incident": incident.get("id", "")},
                help_text="Ranks that went bad after the incident's culprit and because of it.",
            )
        for rank in run.get("ranks", []):
            labels = {"run": name, "rank": rank.get("rank")}
            state = rank.get("state")
            if state is not None:
                out.add(
                    "rankwatch_rank_state",
                    1,
                    {**labels, "state": state},
                    help_text="1 for the rank's current health state.",
                )
            out.add(
                "rankwatch_rank_last_step",
                rank.get("last_step"),
                labels,
                help_text="Last step the rank reported.",
            )
            out.add(
                "rankwatch_rank_last_seen_seconds",
                rank.get("last_seen"),
                labels,
                help_text="Unix time the rank was last heard from.",
            )
            out.add(
                "rankwatch_rank_throughput",
                rank.get("throughput"),
                labels,
                help_text="Samples per second the rank last reported.",
            )
            out.add(
                "rankwatch_rank_dropped_records",
                rank.get("dropped"),
                labels,
                help_text="Records the rank's agent could not queue.",
                kind="counter",
            )
            gaps = rank.get("gaps")
            out.add(
                "rankwatch_rank_sequence_gaps",
                len(gaps) if isinstance(gaps, list) else gaps,
                labels,
                help_text="Missing sequence ranges from the rank.",
            )
            for metric, value in (rank.get("values") or {}).items():
                out.add(
                    "rankwatch_metric_last",
                    json_number(value),  # snapshot values may be strict-JSON strings ("NaN")
                    {**labels, "metric": metric},
                    help_text="Last value of each metric per rank.",
                )
            for metric, z in (rank.get("z") or {}).items():
                out.add(
                    "rankwatch_divergence_z",
                    json_number(z),
                    {**labels, "metric": metric},
                    help_text="Robust z-score of the rank against the others, last step.",
                )
            for metric in rank.get("divergent") or []:
                out.add(
                    "rankwatch_rank_divergent",
                    1,
                    {**labels, "metric": metric},
                    help_text="1 while the rank is flagged as divergent on the metric.",
                )
        out.add(
            "rankwatch_run_divergences",
            run.get("divergences_active", len(run.get("divergences") or [])),
            {"run": name},
            help_text="Active divergences in the run.",
        )
    out.add("rankwatch_alerts_firing", firing, help_text="Alerts currently firing.")
    for key, value in counters.items():
        for name, labels, inner in _flatten(metric_name(str(key)), value):
            out.add(name, inner, labels, help_text=f"Aggregator counter '{key}'.")
    return out.render()


def _telemetry(out: Exposition, telemetry: Mapping[str, Mapping[int, Mapping[str, Any]]]) -> None:
    """Each rank's latest telemetry: every value as ``rankwatch_telemetry{name=...}``, and the
    values DCGM exporter and npu-exporter publish under their names, units and device label
    (``gpu`` / ``id``: the card's index on its host; docs/telemetry.md has the table), with
    ``run`` and ``rank`` added so a dashboard built for them can be filtered by rank."""
    for run, ranks in telemetry.items():
        for rank, card in sorted(ranks.items()):
            device = str(card.get("device") or "")
            kind, _, index = device.partition(":")
            host = str(card.get("host") or "")
            base = {"run": run, "rank": rank}
            for name, value in sorted((card.get("values") or {}).items()):
                out.add(
                    "rankwatch_telemetry",
                    value,
                    {**base, "name": name, "device": device, "Hostname": host},
                    help_text="Latest telemetry value of each rank (name: <source>/<key>).",
                )
                m = BY_NAME.get(name)
                if m is None or not isinstance(value, (int, float)):
                    continue
                if m.dcgm and kind == "gpu":
                    labels = {"gpu": index, "device": f"nvidia{index}", "Hostname": host, **base}
                    out.add(m.dcgm, value * m.prom_scale, labels, help_text=f"{m.title} "
                            "(DCGM exporter's name and unit).")  # fmt: skip
                elif m.npu and kind == "npu":
                    labels = {"id": index, "Hostname": host, **base}
                    out.add(m.npu, value * m.prom_scale, labels, help_text=f"{m.title} "
                            "(npu-exporter's name and unit).")  # fmt: skip
