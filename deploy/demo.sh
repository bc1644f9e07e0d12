#!/bin/sh
# Loopback demo: two rpcrdmad daemons (soft provider), an RDMATEST server app on the
# server daemon, a client app calling through the client daemon, then rpcrdmactl.
# Run from the repository root: sh deploy/demo.sh [COUNT]   (PROFILE=release for figures)
set -eu
count=${1:-1000}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
profile=${PROFILE:-debug}
if [ "$profile" = release ]; then
  cargo build -q --release -p rpcrdma-control --bins
else
  cargo build -q -p rpcrdma-control --bins
fi
bin=$CARGO_TARGET_DIR/$profile
pids=""
cleanup() { for p in $pids; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM HUP PIPE
mkdir -p /tmp/rpcrdmad-demo-server /tmp/rpcrdmad-demo-client
$bin/rpcrdmad --config deploy/demo-server.toml 2>/tmp/rpcrdmad-demo-server/log & pids="$pids $!"
$bin/rpcrdmad --config deploy/demo-client.toml 2>/tmp/rpcrdmad-demo-client/log & pids="$pids $!"
ctl_c() { $bin/rpcrdmactl --socket /tmp/rpcrdmad-demo-client/admin.sock "$@"; }
ctl_s() { $bin/rpcrdmactl --socket /tmp/rpcrdmad-demo-server/admin.sock "$@"; }
i=0
until ctl_c --json status 2>/dev/null | grep -q '"state": "up"'; do
  i=$((i + 1)); [ $i -lt 100 ] || { echo "daemons did not connect; logs in /tmp/rpcrdmad-demo-*/log"; exit 1; }
  sleep 0.1
done
$bin/rdmatest serve /tmp/rpcrdmad-demo-server/app.sock & pids="$pids $!"
sleep 0.3
$bin/rdmatest call /tmp/rpcrdmad-demo-client/app.sock server "$count"
echo; ctl_c status; echo; ctl_c conns; echo; ctl_c stats; echo; ctl_c latency; echo; ctl_s conns
