#!/usr/bin/env bash
# Install the Prometheus server (Debian package `prometheus`, binary /usr/bin/prometheus) that
# tests/grafana runs against the exporter. Safe to re-run: it returns at once when the binary is
# there. Without root it installs nothing and says so; the tests that need Prometheus then skip.
set -euo pipefail

binary=/usr/bin/prometheus
if [[ -x $binary ]]; then
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "setup-prometheus: $binary missing and not root: not installing it" \
        "(tests marked 'prometheus' will skip; as root: apt-get install prometheus)" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup-prometheus: apt-get not found: install Prometheus so that $binary exists" >&2
    exit 1
fi

# The tests start their own Prometheus on free loopback ports with a throw-away TSDB; the
# package's service would only hold :9090 and scrape in the background. policy-rc.d (exit 101)
# stops maintainer scripts from starting it; ours is removed again unless one was already there.
policy=/usr/sbin/policy-rc.d
if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# Recommends would add prometheus-node-exporter, another service the tests do not want.
apt-get install -y -qq --no-install-recommends prometheus >/dev/null

# The package enables its service for the next boot; we installed it for the binary alone.
if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now prometheus.service >/dev/null 2>&1 || true
elif [[ -x /etc/init.d/prometheus ]] && command -v update-rc.d >/dev/null 2>&1; then
    update-rc.d prometheus disable >/dev/null 2>&1 || true
fi
"$binary" --version 2>&1 | head -n 1
