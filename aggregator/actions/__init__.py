"""Acting on incidents: commands to the ranks (checkpoint, stop, note) and the policies that
send them. ``book`` (the command state machine), ``agree`` (the one stop step), ``policy``
(rules, decisions), ``dryrun`` (what a policy would have done on a stored run): pure;
``desk`` ties them together for the service."""
