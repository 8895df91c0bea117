# Sourced by bin/kafkaesque and bin/test: make .venv/ hold the project and its dependencies.
# Idempotent: a stamp records what was installed, so a second run only compares two hashes.
# Needs a Debian-like machine with python3 >= 3.11; installs python3-venv with apt when missing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
EXTRAS="${KAFKAESQUE_EXTRAS:-dev}"

_log() { echo "[bootstrap] $*" >&2; }

_apt_install() {
    # apt-get install the given Debian packages (root only), updating the lists once.
    if [ "$(id -u)" != 0 ]; then
        _log "missing system packages: $* (run as root, or install them yourself)"
        return 1
    fi
    if [ -z "${_APT_UPDATED:-}" ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        _APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
}

_find_python() {
    for py in python3.11 python3.12 python3.13 python3; do
        if command -v "$py" >/dev/null 2>&1 &&
            "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            command -v "$py"
            return 0
        fi
    done
    return 1
}

_ensure_venv() {
    if [ -x "$VENV/bin/python" ]; then
        return 0
    fi
    local py
    if ! py="$(_find_python)"; then
        _apt_install python3 python3-venv python3-pip
        py="$(_find_python)"
    fi
    if ! "$py" -m venv "$VENV" >&2 2>/dev/null; then
        rm -rf "$VENV"
        _apt_install python3-venv
        "$py" -m venv "$VENV" >&2
    fi
}

_ensure_packages() {
    local stamp_file="$VENV/.kafkaesque-stamp"
    local want
    want="$(cat "$ROOT/pyproject.toml" | sha256sum | cut -c1-16) extras=$EXTRAS"
    if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$want" ]; then
        return 0
    fi
    _log "installing kafkaesque[$EXTRAS] into .venv (first run, or pyproject.toml changed)"
    local pip_log="$VENV/pip-install.log"
    if ! { "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip &&
        "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[$EXTRAS]"; } \
        >"$pip_log" 2>&1; then
        cat "$pip_log" >&2
        _log "pip install failed (log above, also in $pip_log)"
        return 1
    fi
    echo "$want" >"$stamp_file"
}

_ensure_venv
_ensure_packages
export PATH="$VENV/bin:$PATH"
