"""The wire: everything both ends of a ZeroMQ connection must agree on.

``records`` (the schema and its codecs), ``addresses`` (endpoint parsing and the default ports)
and ``curve`` (CurveZMQ key files and the server-side gate). The aggregator, the relay and the
dashboard import this subpackage of the agent and nothing else of it
(``tests/test_import_rules.py`` keeps it so).
"""
