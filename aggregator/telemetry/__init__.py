"""Hardware telemetry on the head node: the table of known telemetry metrics (``metrics``),
cross-rank outliers and fault flags on cards and hosts (``outliers``, pure), the words a card's
state is told in (``cards``), and the incident evidence hook (``evidence``)."""
