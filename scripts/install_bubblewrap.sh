#!/usr/bin/env bash
# The sandbox service isolates model-written code with Debian's bubblewrap; install it if it is missing.
set -euo pipefail
command -v bwrap >/dev/null && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get install -y -q bubblewrap >/dev/null 2>&1 || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q bubblewrap >/dev/null; }
command -v bwrap >/dev/null || { echo "could not install bubblewrap (apt-get install bubblewrap)" >&2; exit 1; }
