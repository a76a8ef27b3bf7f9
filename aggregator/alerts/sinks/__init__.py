"""Alert sinks: the console and each webhook kind, one module each, behind one protocol.

A sink takes alert transitions (``submit``), never blocks the caller, counts what it did and
stops in bounded time (``close``). Webhook kinds differ only in their table (payload shape,
signing, how the service says no), so a kind is one module here holding its ``WebhookKind``;
``registry`` finds them, and the config file and ``--webhook`` resolve kinds through it.
"""
