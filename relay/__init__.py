"""The per-node relay (``rankwatch relay``): runs on compute nodes with the agent's dependencies
only, so it imports the agent's wire part and nothing of the head node's packages."""
