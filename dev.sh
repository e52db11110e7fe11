#!/usr/bin/env bash
# The project's set-up and entry points. Everything a fresh machine needs is installed here.
#   ./dev.sh up       install, then start a local cluster (2 namesrvs, 2 broker groups x 3) with a
#                     status table (./dev.sh up --dledger: the 3-replica dledger-server group)
#   ./dev.sh test     install what tests need, lint, type-check, run the default test suite
#   ./dev.sh soak     the long runs the default suite skips (simulator 20,000 seeds, chaos 30 min)
#   ./dev.sh bench    the benchmarks (bench/*.py), one at a time
set -euo pipefail
cd "$(dirname "$0")"
VENV=${VENV:-.venv}
PY="$VENV/bin/python"

install_system() {
    # iptables and iproute2 for chaos partitions; a JDK 17 for the Spark audit; gcc.
    local missing=()
    command -v ip >/dev/null || missing+=(iproute2)
    command -v iptables >/dev/null || missing+=(iptables)
    # a C compiler and Python's headers for the dispatcher's C half (setup.py, broker/native.py)
    command -v cc >/dev/null || missing+=(gcc)
    python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
        || missing+=(python3-dev)
    if ! command -v java >/dev/null || ! java -version 2>&1 | grep -qE 'version "(1[7-9]|2[0-9])'; then
        missing+=(openjdk-17-jre-headless)
    fi
    if ((${#missing[@]})); then
        echo "dev.sh: installing ${missing[*]}" >&2
        if [ "$(id -u)" = 0 ]; then
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
        else
            sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
        fi
    fi
}

install_python() {
    [ -x "$PY" ] || python3 -m venv "$VENV"
    "$PY" -m pip install -q --upgrade pip >/dev/null
    "$PY" -m pip install -q -e ".[test]"
}

cmd=${1:-help}
shift || true
case "$cmd" in
    up)
        install_system
        install_python
        exec "$VENV/bin/dledger-dev" up --foreground "$@"
        ;;
    test)
        install_system
        install_python
        "$VENV/bin/ruff" check .
        "$VENV/bin/ruff" format --check .
        "$VENV/bin/mypy"
        # exit 5 (no tests collected) is a failure like any other non-zero exit
        exec "$PY" -m pytest -q "$@"
        ;;
    soak)
        install_system
        install_python
        "$PY" -m pytest -q -m slow
        "$PY" -m dledger.raft.sim --seeds 20000 --nodes 3
        "$PY" -m dledger.raft.sim --seeds 20000 --nodes 5
        exec "$VENV/bin/dledger-chaos" run --target dledger --scenario random --duration 1800 --seed 1 --out runs/soak
        ;;
    bench)
        install_system
        install_python
        for b in raft_core log_store dledger broker audit; do "$PY" -m "bench.$b" "$@"; done
        # instruction counts of one message's append and apply on a replica (valgrind)
        command -v valgrind >/dev/null || {
            echo "dev.sh: installing valgrind" >&2
            if [ "$(id -u)" = 0 ]; then
                DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
            else
                sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
            fi
        }
        "$PY" -m bench.apply_cost
        ;;
    *)
        echo "usage: ./dev.sh up|test|soak|bench" >&2
        exit 2
        ;;
esac
