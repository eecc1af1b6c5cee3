#!/usr/bin/env bash
# Sets up, builds and runs every test suite.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/scripts/setup.sh
meson test -C build --print-errorlogs "$@"
