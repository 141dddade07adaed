#!/bin/sh
# Install firstfault as systemd services: install.sh agent|collector|all [options]
#
#   agent      a GPU node: enables firstfault-agent.service
#   collector  the head node: enables firstfault-collector.service
#   all        both on this machine (one machine to try it)
#
# Puts firstfault in its own virtual environment under /opt/firstfault (python3 -m venv, then
# pip), the units in /etc/systemd/system, the users and directories in /etc/sysusers.d and
# /etc/tmpfiles.d, example configurations in /etc/firstfault (never over an existing one), a
# random token in /etc/firstfault/token if there is none (on a cluster: copy the collector's to
# every node), the Slurm prolog/epilog in /opt/firstfault/slurm, the command itself as a link
# /usr/local/bin/firstfault (unless a different file is there); then creates the users and
# directories and enables the unit(s). Running it again upgrades firstfault and the units and
# keeps configuration and token: it is idempotent.
#
# Options:
#   --wheels DIR   install from wheels in DIR only (pip --no-index; e.g. made with
#                  `pip wheel . -w DIR` on a machine with network), not from this source tree
#   --prefix DIR   install into DIR as if it were / (for tests and images): nothing outside it
#                  is touched, users and enablement are written with --root=DIR
#   --start        also start (or restart) the unit(s) now; default: only enable them
#   --python EXE   the Python (>= 3.11) that makes the venv (default python3)
set -eu

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
die() { echo "install.sh: $*" >&2; exit 1; }

ROLE="${1:-}"
case "$ROLE" in agent|collector|all) shift ;; -h|--help) usage ;; *) usage ;; esac
PREFIX="" WHEELS="" START=0 PYTHON=python3
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) PREFIX="${2:?--prefix needs a directory}"; shift 2 ;;
        --wheels) WHEELS="${2:?--wheels needs a directory}"; shift 2 ;;
        --python) PYTHON="${2:?--python needs an executable}"; shift 2 ;;
        --start) START=1; shift ;;
        *) usage ;;
    esac
done
PREFIX="${PREFIX%/}"
SRC="$(cd "$(dirname "$0")/.." && pwd)"
DEPLOY="$SRC/deploy"
VENV="$PREFIX/opt/firstfault"
case "$ROLE" in
    agent) UNITS="firstfault-agent.service" ;;
    collector) UNITS="firstfault-collector.service" ;;
    all) UNITS="firstfault-collector.service firstfault-agent.service" ;;
esac
[ "$(id -u)" = 0 ] || [ -n "$PREFIX" ] || die "run as root (or with --prefix DIR)"
command -v "$PYTHON" >/dev/null 2>&1 || die "no $PYTHON: install python3 (>= 3.11) and python3-venv"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "$PYTHON is older than 3.11"

echo "install.sh: virtual environment $VENV"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV" || die "cannot make a venv (Debian/Ubuntu: apt install python3-venv)"
fi
if [ -n "$WHEELS" ]; then
    "$VENV/bin/python" -m pip install -q --no-index --find-links "$WHEELS" --upgrade firstfault
else
    "$VENV/bin/python" -m pip install -q --upgrade "$SRC"
fi
"$VENV/bin/firstfault" --help >/dev/null || die "$VENV/bin/firstfault does not run"
install -d -m 0755 "$PREFIX/usr/local/bin"
LINK="$PREFIX/usr/local/bin/firstfault"
if [ -L "$LINK" ] || [ ! -e "$LINK" ]; then
    ln -sfn /opt/firstfault/bin/firstfault "$LINK"
else
    echo "install.sh: $LINK exists and is not our link; left as it is (the command: $VENV/bin/firstfault)"
fi

echo "install.sh: units, users, directories, examples under ${PREFIX:-/}"
install -d -m 0755 "$PREFIX/etc/systemd/system" "$PREFIX/etc/sysusers.d" "$PREFIX/etc/tmpfiles.d" \
    "$PREFIX/etc/firstfault" "$VENV/share" "$VENV/slurm"
for u in firstfault-agent.service firstfault-collector.service; do
    install -m 0644 "$DEPLOY/systemd/$u" "$PREFIX/etc/systemd/system/$u"
done
install -m 0644 "$DEPLOY/sysusers.d/firstfault.conf" "$PREFIX/etc/sysusers.d/firstfault.conf"
install -m 0644 "$DEPLOY/tmpfiles.d/firstfault.conf" "$PREFIX/etc/tmpfiles.d/firstfault.conf"
install -m 0644 "$DEPLOY/agent.toml" "$DEPLOY/collector.toml" "$VENV/share/"
[ -f "$SRC/README.md" ] && install -m 0644 "$SRC/README.md" "$VENV/share/README.md"
install -m 0755 "$DEPLOY/slurm/prolog.sh" "$DEPLOY/slurm/epilog.sh" "$DEPLOY/slurm/mark.sh" "$VENV/slurm/"
for c in agent.toml collector.toml; do
    [ -e "$PREFIX/etc/firstfault/$c" ] || install -m 0644 "$DEPLOY/$c" "$PREFIX/etc/firstfault/$c"
done
if [ ! -e "$PREFIX/etc/firstfault/token" ]; then
    (umask 077 && head -c 32 /dev/urandom | base64 > "$PREFIX/etc/firstfault/token")
    echo "install.sh: made a new token in $PREFIX/etc/firstfault/token (agents need the collector's)"
fi
chmod 0600 "$PREFIX/etc/firstfault/token"

if [ -n "$PREFIX" ]; then
    systemd-sysusers --root="$PREFIX" "$PREFIX/etc/sysusers.d/firstfault.conf"
    systemd-tmpfiles --root="$PREFIX" --create "$PREFIX/etc/tmpfiles.d/firstfault.conf"
    systemctl --root="$PREFIX" enable $UNITS
else
    systemd-sysusers /etc/sysusers.d/firstfault.conf
    systemd-tmpfiles --create /etc/tmpfiles.d/firstfault.conf
    systemctl daemon-reload
    systemctl enable $UNITS
    if [ "$START" = 1 ]; then
        systemctl restart $UNITS
    fi
fi
echo "install.sh: done; enabled $UNITS. Edit /etc/firstfault/*.toml, then: systemctl restart $UNITS"
