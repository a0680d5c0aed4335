#!/usr/bin/env bash
# The machine-wide part of seckill's local setup, and the only part that needs root. Run it once:
#
#   sudo bash scripts/prerequisites.sh          # what `make demo` and `make serve` need
#   sudo bash scripts/prerequisites.sh --test   # and what `make test` adds: Chromium, wrk
#
# Everything else (scripts/stack.sh, every make target) runs as you, and writes only under this
# checkout (.tools/, target/) and cargo's bin directory. When stack.sh runs as root (CI) and finds
# something of this missing, it runs this script itself, saying so.
#
# What it changes on the machine, said plainly:
# - Debian packages, only the missing ones: a C toolchain, make, git, curl, jq, PostgreSQL 15 and
#   its client, Redis 7, Python 3 with venv, Node.js with npm; with --test also chromium and wrk.
# - PostgreSQL: starts the machine's cluster if it is down. If the role `postgres` cannot log in
#   over TCP on loopback without a password, it puts two lines first in that cluster's
#   pg_hba.conf, letting every role log in on 127.0.0.1 and ::1 without a password (`trust`), and
#   reloads. A copy of the file as it was is kept beside it (pg_hba.conf.seckill.bak);
#   `sudo bash scripts/prerequisites.sh --restore-pg-auth` puts it back. Any local user can then
#   log in to that PostgreSQL as any role over loopback: do this on a development machine only.
# - Redis: nothing; stack.sh starts its own redis-server on 6379 if none answers there.
set -euo pipefail

HOST=127.0.0.1
PG_PORT=5432
APT_UPDATED=0
TEST=0
RESTORE=0

log() { printf '[prerequisites] %s\n' "$*" >&2; }
die() { printf '[prerequisites] ERROR: %s\n' "$*" >&2; exit 1; }

for arg in "$@"; do
    case "$arg" in
        --test) TEST=1 ;;
        --restore-pg-auth) RESTORE=1 ;;
        *) die "usage: $0 [--test] [--restore-pg-auth]" ;;
    esac
done

[ "$(id -u)" -eq 0 ] || die "run as root: sudo bash $0 $*"

apt_install() {
    command -v apt-get >/dev/null 2>&1 || die "missing packages ($*) and no apt-get here: install them by hand"
    if [ "$APT_UPDATED" -eq 0 ]; then
        log "apt-get update"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        APT_UPDATED=1
    fi
    log "apt-get install $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# Each command the project runs, and the Debian package that brings it.
packages() {
    local pkgs=()
    command -v cc >/dev/null 2>&1 || pkgs+=(build-essential)
    command -v make >/dev/null 2>&1 || pkgs+=(make)
    command -v git >/dev/null 2>&1 || pkgs+=(git)
    command -v curl >/dev/null 2>&1 || pkgs+=(curl ca-certificates)
    command -v jq >/dev/null 2>&1 || pkgs+=(jq)
    command -v psql >/dev/null 2>&1 && command -v pg_ctlcluster >/dev/null 2>&1 \
        && command -v pg_isready >/dev/null 2>&1 || pkgs+=(postgresql postgresql-client)
    command -v redis-server >/dev/null 2>&1 || pkgs+=(redis-server)
    command -v redis-cli >/dev/null 2>&1 || pkgs+=(redis-tools)
    command -v python3 >/dev/null 2>&1 || pkgs+=(python3)
    python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || pkgs+=(python3-venv)
    command -v npm >/dev/null 2>&1 || pkgs+=(nodejs npm)
    if [ "$TEST" -eq 1 ]; then
        [ -x /usr/bin/chromium ] || pkgs+=(chromium)
        command -v wrk >/dev/null 2>&1 || pkgs+=(wrk)
    fi
    if [ "${#pkgs[@]}" -gt 0 ]; then
        apt_install "${pkgs[@]}"
    else
        log "packages: all present"
    fi
}

pg_ready() { pg_isready -q -h "$HOST" -p "$PG_PORT" >/dev/null 2>&1; }
pg_version() { find /etc/postgresql -mindepth 1 -maxdepth 1 -type d -printf '%f\n' 2>/dev/null | sort -V | tail -1; }
pg_trusts_postgres() { PGPASSWORD='' psql -w -X -h "$HOST" -p "$PG_PORT" -U postgres -qtAc 'select 1' >/dev/null 2>&1; }
pg_ctl() { pg_ctlcluster --skip-systemctl-redirect "$1" main "$2" || pg_ctlcluster "$1" main "$2"; }

postgres() {
    local ver hba
    ver="$(pg_version)"
    if ! pg_ready; then
        [ -n "$ver" ] || die "PostgreSQL is not answering on $HOST:$PG_PORT and no cluster in /etc/postgresql"
        log "starting PostgreSQL $ver/main"
        pg_ctl "$ver" start
        for _ in $(seq 1 40); do pg_ready && break; sleep 0.5; done
        pg_ready || die "PostgreSQL did not come up on $HOST:$PG_PORT"
    fi
    if pg_trusts_postgres; then
        log "PostgreSQL: postgres logs in on $HOST:$PG_PORT without a password; pg_hba.conf left as it is"
        return
    fi
    hba="/etc/postgresql/$ver/main/pg_hba.conf"
    [ -w "$hba" ] || die "cannot edit $hba"
    log "PostgreSQL: trust for every role on 127.0.0.1/32 and ::1/128, first in $hba (the file as it was: $hba.seckill.bak)"
    cp -p "$hba" "$hba.seckill.bak"
    {
        echo '# seckill: local trust on loopback (scripts/prerequisites.sh; --restore-pg-auth undoes it)'
        echo 'host    all    all    127.0.0.1/32    trust'
        echo 'host    all    all    ::1/128         trust'
        cat "$hba.seckill.bak"
    } >"$hba"
    pg_ctl "$ver" reload
    for _ in $(seq 1 20); do pg_trusts_postgres && break; sleep 0.5; done
    pg_trusts_postgres || die "still cannot log in to PostgreSQL as postgres"
}

restore_pg_auth() {
    local ver hba
    ver="$(pg_version)"
    hba="/etc/postgresql/$ver/main/pg_hba.conf"
    [ -f "$hba.seckill.bak" ] || die "no $hba.seckill.bak: nothing to restore"
    cp -p "$hba.seckill.bak" "$hba"
    rm -f "$hba.seckill.bak"
    pg_ctl "$ver" reload
    log "restored $hba and reloaded PostgreSQL $ver/main"
}

if [ "$RESTORE" -eq 1 ]; then
    restore_pg_auth
    exit 0
fi
packages
postgres
log "done; everything else runs as your user (make demo, make serve, make test)"
