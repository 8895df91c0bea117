# Sourced by bin/kafkaesque and bin/test: make .venv/ hold the project and its dependencies.
# Idempotent: a stamp records what was installed, so a second run only compares two hashes.
# Needs a Debian-like machine with python3 >= 3.11; installs python3-venv with apt when missing,
# a Java runtime (>= 17, for Spark) when the extras include "spark" and java is missing, and the
# mosquitto server and clients, jq, kcat and nats-server (the benchmarks' peer) when missing, and kafkajs (npm) for its tests.
#
# Both commands install the same extras: the main job (`kafkaesque demo`) ends with a Spark step
# and the suite tests the Spark source, and one set means neither makes the other reinstall.
# KAFKAESQUE_EXTRAS=dev installs less (then `kafkaesque demo --no-spark`).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
EXTRAS="${KAFKAESQUE_EXTRAS:-dev,spark}"

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

_java_major() {
    # The major version of the java on the PATH (0 if none), e.g. 17. Every run of bin/kafkaesque
    # asks, so it reads the runtime's release file (JAVA_VERSION="17.0.15") instead of starting a
    # JVM; a runtime without one is asked for its settings.
    local java version=""
    java="$(command -v java 2>/dev/null)" || { echo 0; return; }
    version="$(sed -n 's/^JAVA_VERSION="\(1\.\)\{0,1\}\([0-9]*\).*/\2/p' \
        "$(dirname "$(readlink -f "$java")")/../release" 2>/dev/null | head -n 1)" || true
    if [ -z "$version" ]; then
        version="$(java -XshowSettings:properties -version 2>&1 |
            sed -n 's/^ *java\.specification\.version = \(1\.\)\{0,1\}\([0-9]*\).*/\2/p' |
            head -n 1)" || true
    fi
    echo "${version:-0}"
}

_ensure_java() {
    # Spark runs on the JVM: PySpark starts `java` from the PATH. Java 17 is what Spark 4 was
    # tested on here; Debian releases without it get their default runtime (21 on trixie).
    case ",$EXTRAS," in *,spark,*) ;; *) return 0 ;; esac
    if [ "$(_java_major)" -ge 17 ] 2>/dev/null; then
        return 0
    fi
    _log "installing a Java runtime for Spark"
    mkdir -p /usr/share/man/man1 2>/dev/null || true # slim images lack it; the JRE's postinst needs it
    if [ -z "${_APT_UPDATED:-}" ] && [ "$(id -u)" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        _APT_UPDATED=1
    fi
    if apt-cache show openjdk-17-jre-headless >/dev/null 2>&1; then
        _apt_install openjdk-17-jre-headless
    else
        _apt_install default-jre-headless
    fi
}

_ensure_mosquitto() {
    # The MQTT bridge's tests, bench/mqtt's baseline and the README's tour use the mosquitto
    # server and its command-line clients. Debian's package would start a system daemon on port
    # 1883 where services may start; nothing of ours uses that port, and a daemon we did not ask
    # for is stopped again.
    if [ -x /usr/sbin/mosquitto ] && command -v mosquitto_pub >/dev/null 2>&1; then
        return 0
    fi
    _log "installing mosquitto (MQTT server and clients)"
    local running_before=""
    pgrep -x mosquitto >/dev/null 2>&1 && running_before=1
    _apt_install mosquitto mosquitto-clients
    if [ -z "$running_before" ] && pgrep -x mosquitto >/dev/null 2>&1; then
        service mosquitto stop >/dev/null 2>&1 || pkill -x mosquitto || true
    fi
}

_ensure_chromium() {
    # The web console's browser tests (tests/broker/test_console_browser.py) drive Debian's
    # chromium with Playwright; Playwright's own browser download does not work on these machines.
    if [ -x /usr/bin/chromium ]; then
        return 0
    fi
    _log "installing chromium (the console's browser tests)"
    _apt_install chromium || _log "chromium did not install: the console's browser tests will skip"
}

_ensure_packages() {
    local stamp_file="$VENV/.kafkaesque-stamp"
    local hash installed="" extras="$EXTRAS" extra missing=""
    hash="$(cat "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)"
    if [ -f "$stamp_file" ] && [ "$(cut -d' ' -f1 "$stamp_file")" = "$hash" ]; then
        installed="$(sed -n 's/^[^ ]* extras=//p' "$stamp_file")"
    fi
    for extra in ${EXTRAS//,/ }; do
        case ",$installed," in *",$extra,"*) ;; *) missing=1 ;; esac
    done
    if [ -n "$installed" ] && [ -z "$missing" ]; then
        return 0
    fi
    # Keep the extras already installed for this pyproject.toml: a run that asked for fewer
    # (KAFKAESQUE_EXTRAS) must not make the next one reinstall.
    for extra in ${installed//,/ }; do
        case ",$extras," in *",$extra,"*) ;; *) extras="$extras,$extra" ;; esac
    done
    _log "installing kafkaesque[$extras] into .venv (first run, or pyproject.toml changed)"
    local pip_log="$VENV/pip-install.log"
    if ! { "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip &&
        "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[$extras]"; } \
        >"$pip_log" 2>&1; then
        cat "$pip_log" >&2
        _log "pip install failed (log above, also in $pip_log)"
        return 1
    fi
    echo "$hash extras=$extras" >"$stamp_file"
}

_ensure_jq() {
    # docs/operations.md's failover walk-through reads a broker's pid from cluster-up.json with jq
    # (and its doc test runs it as written).
    if command -v jq >/dev/null 2>&1; then
        return 0
    fi
    _log "installing jq (the docs' walk-throughs read JSON with it)"
    _apt_install jq
}

_ensure_kcat() {
    # The Kafka protocol's tests and docs/kafka.md's walk-through run kcat (librdkafka), the
    # Kafka user's own tool.
    if command -v kcat >/dev/null 2>&1; then
        return 0
    fi
    _log "installing kcat (a Kafka client the Kafka protocol's tests use)"
    _apt_install kcat
}

_ensure_telnet() {
    # tests/broker/test_telnet.py and docs/record_transcript.py drive the system telnet client.
    if command -v telnet >/dev/null 2>&1; then
        return
    fi
    _log "installing telnet (the line protocol's telnet tests and transcript)"
    _apt_install telnet
}

_ensure_nats() {
    # bench/broker and bench/mqtt measure NATS JetStream (and its MQTT listener) in the same run
    # as our brokers: Debian's nats-server. Like mosquitto's, a daemon the package starts is
    # stopped again; the benchmarks start their own servers on free ports.
    if [ -x /usr/sbin/nats-server ] || command -v nats-server >/dev/null 2>&1; then
        return 0
    fi
    _log "installing nats-server (the benchmarks' peer)"
    local running_before=""
    pgrep -x nats-server >/dev/null 2>&1 && running_before=1
    _apt_install nats-server
    if [ -z "$running_before" ] && pgrep -x nats-server >/dev/null 2>&1; then
        service nats-server stop >/dev/null 2>&1 || pkill -x nats-server || true
    fi
}

_ensure_kafkajs() {
    # tests/broker/test_kafka_kafkajs.py runs kafkajs (from the npm registry, pinned in
    # tests/kafkajs/package.json) with the machine's Node.js; its node_modules is a cache, never
    # committed. A stamp holding package.json's hash makes a second run a comparison.
    local dir="$ROOT/tests/kafkajs" stamp
    case ",$EXTRAS," in
    *,dev,*) ;;
    *) return 0 ;; # a test tool: only with the dev extra
    esac
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        _log "installing Node.js and npm (the kafkajs tests' runtime)"
        _apt_install nodejs npm || return 0
    fi
    stamp="$(sha256sum "$dir/package.json" | cut -d' ' -f1)"
    if [ -f "$dir/node_modules/.kafkaesque-stamp" ] &&
        [ "$(cat "$dir/node_modules/.kafkaesque-stamp")" = "$stamp" ]; then
        return 0
    fi
    _log "installing kafkajs into tests/kafkajs/node_modules (npm)"
    if (cd "$dir" && npm install --no-audit --no-fund --loglevel=error >&2); then
        echo "$stamp" >"$dir/node_modules/.kafkaesque-stamp"
    else
        _log "npm install failed: the kafkajs tests will skip"
    fi
}

_ensure_bytecode() {
    # Every broker, CLI call and load generator is a new Python process. Where the environment
    # sets PYTHONDONTWRITEBYTECODE (this machine's image does), none of them keeps the bytecode
    # it compiles, so each compiled our few hundred modules again: about half a second of CPU
    # per process, and a test run starts thousands (a broker test module took 42 s of CPU
    # instead of 24). compileall writes the caches anyway, recompiling only what changed; a
    # cache older than its source is ignored, so a stale one costs nothing but that start.
    "$VENV/bin/python" -m compileall -q -j 0 "$ROOT/kafkaesque" "$ROOT/cli" \
        "$ROOT/spark_source" "$ROOT/jepsen_like" "$ROOT/bench" >/dev/null ||
        _log "compileall failed: processes compile their modules at each start"
}

_ensure_venv
_ensure_packages
_ensure_bytecode
_ensure_java
_ensure_mosquitto
_ensure_jq
_ensure_kcat
_ensure_telnet
_ensure_nats
_ensure_kafkajs
_ensure_chromium
export PATH="$VENV/bin:$PATH"
