#!/usr/bin/env bash
# Preflight of the arm64 deploy build, without building: does this machine have what
# `sam build` (cargo lambda build --release --arm64 --bin <Binary>, once per function) and
# `make build` need to cross-compile the functions for template.yaml's Architectures: [arm64]?
#
#   bash scripts/check-build-tools.sh
#
# One line per tool, `ok  ` or `FAIL` with the command that fixes it; exits 1 if any fails.
#   cargo-lambda  the venv's (make tools-lambda), found on PATH as the build finds it;
#   the target    the aarch64-unknown-linux-gnu standard library in the toolchain cargo uses in
#                 this checkout (cargo-lambda tries `rustup +stable target add` itself, but
#                 silently, into the `stable` toolchain only, and builds on when that fails: the
#                 error is then rustc's "can't find crate for `core`");
#   zig           the cross linker: cargo-lambda runs `python3 -m ziglang` (else a `zig` on
#                 PATH), so python3 must be the venv's, whose cargo-lambda wheel brings ziglang.
# The build runs with the venv activated (the Makefile's build recipe; docs/deploy.md for
# `sam build`), so this script checks under the same PATH, and says when the caller's own
# shell would not find zig (a note, not a failure: `make` recipes activate it themselves).
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo" || exit 1
target=aarch64-unknown-linux-gnu
venv=.tools/venv
failed=0

ok() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failed=1; }

# The caller's python3, before the venv is activated (what a plain `sam build` would use).
caller_zig=$(python3 -m ziglang version 2>/dev/null) || caller_zig=""

# shellcheck source=env.sh
source scripts/env.sh
if [[ -f "$venv/bin/activate" ]]; then
    # shellcheck disable=SC1091
    source "$venv/bin/activate"
fi

# 1. cargo-lambda
if command -v cargo-lambda >/dev/null 2>&1 && version=$(cargo lambda --version 2>/dev/null); then
    ok "cargo-lambda: $version ($(command -v cargo-lambda))"
else
    fail "cargo-lambda: not found on PATH -- run 'make tools-lambda' (installs cargo-lambda and the SAM CLI into $venv)"
fi

# 2. the aarch64 standard library, in the toolchain cargo resolves here (rust-toolchain file,
#    override or default); rustc answers for the same toolchain as cargo.
toolchain=$(rustup show active-toolchain 2>/dev/null | awk '{print $1}') || toolchain=""
if ! command -v rustc >/dev/null 2>&1; then
    fail "the $target target: no rustc on PATH -- install Rust with rustup (README.md, Prerequisites)"
elif libdir=$(rustc --print target-libdir --target "$target" 2>/dev/null) \
        && compgen -G "$libdir/libcore-*.rlib" >/dev/null; then
    ok "the $target target: installed in ${toolchain:-the active toolchain} ($libdir)"
else
    fail "the $target target: its standard library is not installed in ${toolchain:-the active toolchain}" \
        "-- run 'rustup target add $target' in this checkout"
fi

# 3. zig, as cargo-lambda looks for it: `python3 -m ziglang version` first, then `zig version`.
if zig_version=$(python3 -m ziglang version 2>/dev/null) && [[ -n "$zig_version" ]]; then
    ok "zig: $zig_version (python3 -m ziglang, $(command -v python3))"
elif zig_version=$(zig version 2>/dev/null) && [[ -n "$zig_version" ]]; then
    ok "zig: $zig_version ($(command -v zig))"
else
    fail "zig: 'python3 -m ziglang version' fails with $(command -v python3 || echo 'no python3')" \
        "-- run 'make tools-lambda' (the cargo-lambda wheel brings ziglang into $venv)"
fi
if [[ $failed -eq 0 && -z "$caller_zig" ]]; then
    echo "note this shell's python3 has no ziglang: 'source $venv/bin/activate' before 'sam build'" \
        "(make build activates it itself)"
fi

if [[ $failed -ne 0 ]]; then
    echo "check-build-tools: the arm64 build (sam build, make build) would fail; fix the FAIL lines above" >&2
    exit 1
fi
echo "check-build-tools: cargo-lambda, the $target target and zig are ready for the arm64 build"
