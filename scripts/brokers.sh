# Sourced by scripts/test, scripts/faults and scripts/soak: makes sure the
# brokers the end-to-end tests need are up, and stops what it started when
# the sourcing script exits.

HOURGLASS_SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$HOURGLASS_SCRIPTS/roots.sh"

# Commands run when the sourcing script exits, in the order they were added.
HOURGLASS_ON_EXIT=()
on_exit() {
  HOURGLASS_ON_EXIT+=("$1")
  trap 'for command in "${HOURGLASS_ON_EXIT[@]}"; do eval "$command" || true; done' EXIT
}

port_open() {
  (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null
}

# The RabbitMQ the tests run on: VERSION 3.10 (the default) is the machine's
# own node on 5672; 4.0 and 4.3 are nodes of their own started from Debian
# roots (scripts/roots.sh) and stopped when the script exits. Exports the
# test broker's URLs and HOURGLASS_TEST_RABBITMQ, which the tests' private
# nodes and scripts/cluster follow (scripts/rabbitmq).
ensure_rabbitmq() {
  local version=${1:-3.10}
  export HOURGLASS_TEST_RABBITMQ=$version
  if [ "$version" = 3.10 ]; then
    ensure_machine_rabbitmq
  else
    start_rabbitmq_version "$version"
  fi
  echo "RabbitMQ under test: $version at ${HOURGLASS_TEST_AMQP_URL/guest:guest@/} (management ${HOURGLASS_TEST_MANAGEMENT_URL/guest:guest@/})" >&2
}

# Stops NODE of RabbitMQ VERSION, if it runs.
stop_rabbitmq_node() {
  HOURGLASS_TEST_RABBITMQ=$1 "$HOURGLASS_SCRIPTS/rabbitmq" runuser -u rabbitmq -- env HOME=/var/lib/rabbitmq \
    rabbitmqctl -q -n "$2" stop >/dev/null 2>&1 || true
}

# A node of RabbitMQ VERSION from its Debian root, for the tests: AMQP on
# 56xx (5643 for 4.3, 5640 for 4.0), management on AMQP + 10000, Erlang
# distribution on AMQP + 20000; fresh data each time.
start_rabbitmq_version() {
  local version=$1 suite port node dir
  suite=$(rabbitmq_suite "$version") || exit 1
  debian_root "$suite" >/dev/null || exit 1
  port=$((5600 + ${version//./}))
  node="hg-test-${version//./}@localhost"
  dir="$(realpath "${TMPDIR:-/tmp}")/hourglass-rabbitmq-$version"
  # A node left by a run that was killed before it could stop it.
  stop_rabbitmq_node "$version" "$node"
  if port_open "$port"; then
    echo "error: 127.0.0.1:$port is taken; RabbitMQ $version's test node needs it (stop what listens there)" >&2
    exit 1
  fi
  rm -rf "$dir"
  mkdir -p "$dir/mnesia" "$dir/log"
  {
    echo "listeners.tcp.local = 127.0.0.1:$port"
    echo "loopback_users = none"
    echo "management.tcp.ip = 127.0.0.1"
    echo "management.tcp.port = $((port + 10000))"
  } >"$dir/rabbitmq.conf"
  echo "[rabbitmq_management]." >"$dir/enabled_plugins"
  "$HOURGLASS_SCRIPTS/rabbitmq" chown -R rabbitmq:rabbitmq "$dir"
  echo "starting RabbitMQ $version ($node) from $HOURGLASS_ROOTS/$suite on 127.0.0.1:$port" >&2
  (
    cd "$dir"
    exec "$HOURGLASS_SCRIPTS/rabbitmq" runuser -u rabbitmq -- env HOME=/var/lib/rabbitmq \
      RABBITMQ_NODENAME="$node" RABBITMQ_NODE_PORT="$port" RABBITMQ_DIST_PORT=$((port + 20000)) \
      RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/log" \
      RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" \
      rabbitmq-server -detached
  )
  on_exit "stop_rabbitmq_node '$version' '$node'; rm -rf '$dir'"
  local deadline=$((SECONDS + 120))
  until port_open "$port" && port_open $((port + 10000)); do
    if (( SECONDS > deadline )); then
      echo "error: RabbitMQ $version did not open 127.0.0.1:$port and :$((port + 10000)) within 120 s; log tail:" >&2
      tail -n 30 "$dir/log/$node.log" >&2 2>/dev/null || echo "(no log written)" >&2
      exit 1
    fi
    sleep 0.5
  done
  export HOURGLASS_TEST_AMQP_URL="amqp://guest:guest@127.0.0.1:$port/%2f"
  export HOURGLASS_TEST_MANAGEMENT_URL="http://guest:guest@127.0.0.1:$((port + 10000))"
}

# The machine's own RabbitMQ on 5672, started when it is down.
ensure_machine_rabbitmq() {
  if ! port_open 5672; then
    if ! command -v rabbitmq-server >/dev/null 2>&1; then
      echo "error: RabbitMQ is not running on 127.0.0.1:5672 and is not installed." >&2
      echo "       Install it (Debian: apt-get install rabbitmq-server) and run: rabbitmq-server -detached" >&2
      exit 1
    fi
    echo "RabbitMQ is down; starting it with: rabbitmq-server -detached" >&2
    # Quorum queues reserve file handles: at the default soft limit (1024) leaked test queues once blocked every new connection.
    # A subshell, so the caller's own limit stays as it was.
    (
      limit=$(ulimit -Hn)
      if [[ $limit == unlimited ]] || (( limit > 65536 )); then limit=65536; fi
      ulimit -n "$limit" 2>/dev/null || true
      exec rabbitmq-server -detached
    )
  fi
  # await_startup fails at once while the node is still booting: poll it.
  local deadline=$((SECONDS + 90))
  until rabbitmqctl -q await_startup >/dev/null 2>&1 && port_open 5672; do
    if (( SECONDS > deadline )); then
      echo "error: RabbitMQ did not come up within 90 s on 127.0.0.1:5672 (guest/guest)." >&2
      echo "       Check: rabbitmqctl status; start it with: rabbitmq-server -detached" >&2
      exit 1
    fi
    sleep 1
  done
  export HOURGLASS_TEST_AMQP_URL="amqp://guest:guest@127.0.0.1:5672/%2f"
  export HOURGLASS_TEST_MANAGEMENT_URL="http://guest:guest@127.0.0.1:15672"

  # `verify` reads bindings from the management API; its tests need it.
  if ! port_open 15672; then
    echo "enabling the RabbitMQ management plugin (for verify's tests)" >&2
    rabbitmq-plugins enable --quiet rabbitmq_management >/dev/null
    deadline=$((SECONDS + 60))
    until port_open 15672; do
      if (( SECONDS > deadline )); then
        echo "error: the RabbitMQ management API did not come up on 127.0.0.1:15672." >&2
        echo "       Run: rabbitmq-plugins enable rabbitmq_management" >&2
        exit 1
      fi
      sleep 1
    done
  fi
}

# The NATS server the tests run on: VERSION 2.9 (the default) is the
# machine's own on 4222, with JetStream; 2.10 and 2.15 are servers of their
# own from Debian roots (trixie and sid, scripts/roots.sh) on 42xx (4210,
# 4215) with fresh storage, stopped when the script exits. Exports
# HOURGLASS_TEST_NATS_URL and HOURGLASS_TEST_NATS.
ensure_nats() {
  local version=${1:-2.9}
  export HOURGLASS_TEST_NATS=$version
  case "$version" in
    2.9) ensure_machine_nats ;;
    *)
      local suite
      suite=$(nats_suite "$version") || exit 1
      start_nats_version "$version" "$suite"
      ;;
  esac
  echo "NATS under test: $version at $HOURGLASS_TEST_NATS_URL" >&2
}

ensure_machine_nats() {
  export HOURGLASS_TEST_NATS_URL=nats://127.0.0.1:4222
  port_open 4222 && return 0
  echo "nats-server is down; starting it with JetStream on 127.0.0.1:4222" >&2
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
  for _ in $(seq 1 50); do
    port_open 4222 && return 0
    sleep 0.2
  done
  echo "error: nats-server did not open 127.0.0.1:4222 within 10 s; see /var/log/nats-server.log" >&2
  exit 1
}

start_nats_version() {
  local version=$1 suite=$2 root port dir
  root=$(debian_root "$suite") || exit 1
  port=$((4200 + ${version#*.}))
  dir="$(realpath "${TMPDIR:-/tmp}")/hourglass-nats-$version"
  # A server left by a run that was killed before it could stop it.
  [ -f "$dir/pid" ] && kill "$(cat "$dir/pid")" 2>/dev/null && sleep 0.5
  if port_open "$port"; then
    echo "error: 127.0.0.1:$port is taken; nats-server $version's test server needs it (stop what listens there)" >&2
    exit 1
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  chroot "$root" nats-server -a 127.0.0.1 -p "$port" -js -sd "$dir/jetstream" -l "$dir/log" -P "$dir/pid" &
  on_exit "kill \$(cat '$dir/pid' 2>/dev/null) 2>/dev/null"
  for _ in $(seq 1 50); do
    if port_open "$port"; then
      export HOURGLASS_TEST_NATS_URL=nats://127.0.0.1:$port
      return 0
    fi
    sleep 0.2
  done
  echo "error: nats-server $version did not open 127.0.0.1:$port within 10 s; log tail:" >&2
  tail -n 20 "$dir/log" >&2
  exit 1
}

# moto[server] in a venv kept between runs (HOURGLASS_MOTO_VENV).
install_moto() {
  MOTO_VENV="${HOURGLASS_MOTO_VENV:-$HOME/.cache/hourglass/moto-venv}"
  if [ ! -x "$MOTO_VENV/bin/moto_server" ]; then
    echo "installing moto[server] from PyPI into $MOTO_VENV (the local SQS server for the tests)" >&2
    if ! { python3 -m venv "$MOTO_VENV" && "$MOTO_VENV/bin/pip" install --quiet 'moto[server]==5.2.5'; }; then
      echo "error: could not install moto[server] into $MOTO_VENV; the SQS tests need it (python3 with venv and pip, and PyPI)" >&2
      exit 1
    fi
  fi
}

# A local SQS-compatible server (moto) on a free loopback port, stopped when
# the calling script exits.
ensure_sqs() {
  install_moto
  local port
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
  local log="${TMPDIR:-/tmp}/hourglass-moto-$port.log"
  # moto_server with its SQS clock reads made cheap (scripts/moto_server.py says why).
  "$MOTO_VENV/bin/python" "$HOURGLASS_SCRIPTS/moto_server.py" -H 127.0.0.1 -p "$port" >"$log" 2>&1 &
  MOTO_PID=$!
  on_exit 'kill "$MOTO_PID" 2>/dev/null'

  local deadline=$((SECONDS + 30))
  until port_open "$port"; do
    if (( SECONDS > deadline )) || ! kill -0 "$MOTO_PID" 2>/dev/null; then
      echo "error: moto_server did not start on 127.0.0.1:$port; see $log" >&2
      exit 1
    fi
    sleep 0.2
  done
  export AWS_ENDPOINT_URL_SQS="http://127.0.0.1:$port"
  export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
}

# Python with pika and nats-py, for the tests of the example programs
# (examples/redelivery_consumer.py, examples/delayed-exchange, examples/nats-python).
# The venv is kept between runs.
ensure_example_python() {
  local venv="${HOURGLASS_EXAMPLES_VENV:-$HOME/.cache/hourglass/examples-venv}"
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import pika, nats' 2>/dev/null; then
    echo "installing pika and nats-py from PyPI into $venv (for the example programs' tests)" >&2
    if ! { python3 -m venv "$venv" && "$venv/bin/pip" install --quiet 'pika==1.3.2' 'nats-py==2.16.0'; }; then
      echo "error: could not install pika and nats-py into $venv; the example programs' tests need them (python3 with venv and pip, and PyPI)" >&2
      exit 1
    fi
  fi
  export HOURGLASS_TEST_PYTHON="$venv/bin/python"
}

# The Python example planner (examples/python-planner), built with componentize-py
# from PyPI in a venv kept across runs; the end-to-end test loads the planner.wasm.
ensure_python_planner() {
  export HOURGLASS_PY_PLANNER_VENV="${HOURGLASS_PY_PLANNER_VENV:-$HOME/.cache/hourglass/componentize-py-venv}"
  if ! examples/python-planner/build >/dev/null; then
    echo "error: could not build examples/python-planner (python3 with venv and pip, and PyPI for componentize-py)" >&2
    exit 1
  fi
}

# The JavaScript example planner (examples/js-planner), built with componentize-js
# from npm into a folder kept across runs.
ensure_js_planner() {
  export HOURGLASS_JS_PLANNER_TOOLS="${HOURGLASS_JS_PLANNER_TOOLS:-$HOME/.cache/hourglass/componentize-js}"
  if ! examples/js-planner/build >/dev/null; then
    echo "error: could not build examples/js-planner (node and npm, and the npm registry for componentize-js)" >&2
    exit 1
  fi
}

# Debian's Chromium, for the status page's browser test (tests/tests/status_page.rs).
ensure_chromium() {
  if [ ! -x /usr/bin/chromium ]; then
    echo "installing Debian's chromium with apt (for the status page's browser test)" >&2
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    if ! { $sudo apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q chromium >/dev/null; }; then
      echo "error: could not install chromium; the status page's browser test needs it: apt-get install chromium" >&2
      exit 1
    fi
  fi
  export HOURGLASS_TEST_BROWSER=/usr/bin/chromium
}

# Everything the tests need that is downloaded or installed once per machine:
# the venvs, the example planners' tools, Chromium, and the Debian roots of
# the RabbitMQ and NATS VERSIONS given (as `rabbitmq:4.3 nats:2.15`). On a
# fresh machine that is minutes of network and disk, little CPU: scripts/test
# runs it beside the gates and the build.
provision() {
  local wanted suite suites=()
  for wanted in "$@"; do
    case "$wanted" in
      rabbitmq:3.10 | nats:2.9) continue ;; # the machine's own
      rabbitmq:*) suite=$(rabbitmq_suite "${wanted#rabbitmq:}") || exit 1 ;;
      nats:*) suite=$(nats_suite "${wanted#nats:}") || exit 1 ;;
    esac
    [[ " ${suites[*]} " == *" $suite "* ]] || suites+=("$suite")
  done
  install_moto
  ensure_example_python
  ensure_python_planner
  ensure_js_planner
  ensure_chromium
  for suite in "${suites[@]}"; do
    debian_root "$suite" >/dev/null || exit 1
  done
}
