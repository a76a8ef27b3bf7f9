"""Which folders make which packages: the metadata is in pyproject.toml.

The folder tree is the architecture: each top-level folder is one subpackage of ``rankwatch``
(``agent/`` is ``rankwatch.agent``). setuptools cannot discover packages under such a mapping by
itself, so every folder below a mapped one that has an ``__init__.py`` is found here: a new
subpackage needs no edit. The dashboard's static files are data packages of their own so the
wheel carries them (and setuptools does not warn about undeclared package folders).
"""

from setuptools import find_namespace_packages, find_packages, setup

PACKAGE_DIRS = {
    "rankwatch": "rankwatch",
    "rankwatch.agent": "agent",
    "rankwatch.aggregator": "aggregator",
    "rankwatch.relay": "relay",
    "rankwatch.dashboard": "dashboard",
    "rankwatch.cli": "cli",
    "rankwatch.demo": "demo",
}
STATIC = "rankwatch.dashboard.static"


def packages() -> list[str]:
    found = []
    for name, folder in PACKAGE_DIRS.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_packages(folder)]
    return sorted(found + static_packages())


def static_packages() -> list[str]:
    return [STATIC] + [f"{STATIC}.{sub}" for sub in find_namespace_packages("dashboard/static")]


setup(
    packages=packages(),
    package_dir=PACKAGE_DIRS,
    package_data={name: ["*"] for name in static_packages()},
)
