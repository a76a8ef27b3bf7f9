#!/usr/bin/env bash
# Sets up a fresh machine for the demo or the tests: a virtual environment in .venv with
# rankwatch (editable) and what the chosen use needs. Idempotent: a second run only checks.
#   bash deploy/dev-setup.sh            # the demo: the server and MindSpore, nothing else
#   bash deploy/dev-setup.sh --tests    # the test suite: also PyTorch, pytest, Playwright, ruff,
#                                       # MindFormers (in .venv/mindformers), and Debian's
#                                       # chromium and iproute2 (browser, netns tests),
#                                       # prometheus and victoria-metrics (their tests)
set -euo pipefail
cd "$(dirname "$0")/.."

want_system=0
[ "${1:-}" = "--tests" ] && want_system=1

if [ "$want_system" = 1 ]; then
  missing=()
  [ -x /usr/bin/chromium ] || missing+=(chromium)
  command -v ip >/dev/null 2>&1 || missing+=(iproute2)
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
      echo "installing Debian packages: ${missing[*]}"
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
      echo "warning: ${missing[*]} missing and not root; browser/netns tests will skip" >&2
    fi
  fi
  engines=()  # servers the tests start themselves: not their recommended exporters
  command -v prometheus >/dev/null 2>&1 || engines+=(prometheus)
  command -v victoria-metrics >/dev/null 2>&1 || engines+=(victoria-metrics)
  if [ ${#engines[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
      echo "installing Debian packages: ${engines[*]}"
      [ ${#missing[@]} -gt 0 ] || apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${engines[@]}" >/dev/null 2>&1
    else
      echo "warning: ${engines[*]} missing and not root; their tests will skip" >&2
    fi
  fi
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# setuptools 77 reads the SPDX license string; the packaging test builds the wheel with the
# venv's own setuptools (no download at test time).
.venv/bin/python -m pip install -q --upgrade pip 'setuptools>=77' wheel 2>&1 \
  | grep -v '^WARNING: Location' || true
# MindSpore 2.10 needs numpy<2; torch 2.13.0 is the CPU build.
extras=server,mindspore
[ "$want_system" = 1 ] && extras=dev,mindspore,torch,lightning,hf
# The framework adapters' tests run against these versions (the extras accept a range).
if [ "$want_system" = 1 ]; then
  .venv/bin/python -m pip install -q torch==2.13.0 lightning==2.6.6 transformers==5.24.0 \
    accelerate==1.15.0 2>&1 | grep -v '^WARNING: Location' || true
fi
# setuptools' notice that an editable install maps folders through a meta path finder is how
# the folder-per-subpackage layout installs editable, not a problem: only that one is muted.
PYTHONWARNINGS="ignore:Editable installation:UserWarning" \
  .venv/bin/python -m pip install -q -e ".[$extras]" 2>&1 | grep -v '^WARNING: Location' || true
if [ "$want_system" = 1 ] && [ ! -d .venv/mindformers ]; then
  # MindFormers 2.0.0 for its msrun test, in a folder of its own that only that job reads
  # (after the venv's packages): its import pulls datasets, pyarrow and pandas, which the rest
  # of the suite must not see. Its dependency hyper-parallel is not on PyPI, hence --no-deps and
  # the dependencies its import needs by name; numpy stays MindSpore's 1.26 (pyarrow 26 wants 2).
  mf=.venv/mindformers.partial
  rm -rf "$mf"
  echo "installing MindFormers 2.0.0 into .venv/mindformers"
  .venv/bin/python -m pip install -q --target "$mf" --no-deps mindformers==2.0.0 2>&1 \
    | grep -v '^WARNING: Location' || true
  .venv/bin/python -m pip install -q --target "$mf" numpy==1.26.4 'pyarrow<26' nltk==3.9.1 \
    pyyaml deprecated regex requests jieba rouge_chinese datasets tokenizers sentencepiece \
    tiktoken mindpet tensorboardX 2>&1 | grep -v '^WARNING: \(Location\|Target directory\)' || true
  [ -d "$mf/mindformers" ] && [ -d "$mf/datasets" ] && mv "$mf" .venv/mindformers \
    || echo "warning: MindFormers did not install; its test will skip" >&2
fi
.venv/bin/python -c "import rankwatch.agent, rankwatch.aggregator, rankwatch.dashboard, zmq, duckdb, fastapi, msgspec" \
  || { echo "setup failed: rankwatch did not import" >&2; exit 1; }
echo "setup done: $(.venv/bin/python --version), rankwatch in .venv"
