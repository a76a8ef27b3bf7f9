"""Incidents: one fault, its culprit rank(s), the ranks it reached, and where stalled ranks are.

``model`` (the values), ``facts`` (evidence from inputs), ``rules`` (culprit rules),
``grouping`` (which incident evidence belongs to), ``tracker`` (routing), ``judging`` (an
incident's evidence into its value and transitions),
``stacks`` (grouping stack samples), ``oneline`` (crash messages in one line), ``progress``
(a hang's least-progress ranks, kept). All pure.
"""

from rankwatch.aggregator.incidents.model import Evidence, Incident, IncidentChange
from rankwatch.aggregator.incidents.oneline import is_collective_failure, one_line
from rankwatch.aggregator.incidents.stacks import StackGroup, StackSample, group_stacks
from rankwatch.aggregator.incidents.tracker import IncidentConfig, IncidentTracker

__all__ = [
    "Evidence", "Incident", "IncidentChange", "IncidentConfig", "IncidentTracker", "StackGroup",
    "StackSample", "group_stacks", "is_collective_failure", "one_line",
]  # fmt: skip
