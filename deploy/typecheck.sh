#!/usr/bin/env bash
# Type-checks the package with mypy. The folders map onto `rankwatch.*` (setup.py), which mypy
# cannot follow through an editable install, so it checks a tree of links laid out as installed.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=build/typecheck
rm -rf "$tree" && mkdir -p "$tree/rankwatch"
ln -s ../../../rankwatch/__init__.py "$tree/rankwatch/__init__.py"
for folder in agent aggregator dashboard cli demo relay; do
  ln -s "../../../$folder" "$tree/rankwatch/$folder"
done
MYPYPATH="$tree" exec .venv/bin/mypy -p rankwatch "$@"
