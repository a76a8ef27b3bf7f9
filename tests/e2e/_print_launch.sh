#!/bin/sh
# Stands in for msrun/torchrun in test_deploy.py: prints the environment and the arguments.
env
echo "--args--"
for arg in "$@"; do printf '%s\n' "$arg"; done
