#!/usr/bin/env bash
# Build Spillway's sandbox images into sandbox-images/: jq.wasm, javascript.wasm
# (WASI preview1 command modules, Rust) and python.wasm (a wasi:cli/command
# component, componentize-py), each with its manifest <name>.json; plus
# probe.wasm, the test guest the tests and benches send as a `wasm` module.
#
#   guest/build-images.sh [jq] [javascript] [python] [probe]     (default: all)
#
# jq and javascript are pre-initialized with Wizer (wasmtime-wizer 48, through
# examples/wizer.rs of the server crate): their `wizer-initialize` export runs at
# build time (jaq's parsed standard library; QuickJS's runtime, context and
# prelude) and the image starts from that snapshot.
#
# Installs what it needs when it is missing, and only then: the rustup target
# wasm32-wasip1; Debian's clang-14, lld-14, wasi-libc and libclang-rt-14-dev-wasm32
# (javascript only); componentize-py 0.25 in a venv under sandbox-images/build/.
# An image whose inputs did not change is not rebuilt (cargo decides for the Rust
# images; a hash of the sources for python). See guest/README.md.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GUEST="$ROOT/guest"
OUT="$ROOT/sandbox-images"
# The build directory may be a link to a cache shared by several clones (CI
# links it): resolve it, so that the venv's scripts name its real path and
# still run after the clone that made them is gone.
mkdir -p "$OUT/build"
BUILD="$(cd -P "$OUT/build" && pwd)"
TARGET_DIR="$BUILD/target"
VENV="$BUILD/venv"
COMPONENTIZE_PY_VERSION="0.25.*"
APT_PACKAGES=(clang-14 lld-14 wasi-libc libclang-rt-14-dev-wasm32)
# The machine is shared with other builds: stay polite.
NICE=(nice -n 10)

images=("$@")
[ ${#images[@]} -gt 0 ] || images=(jq javascript python probe)
for image in "${images[@]}"; do
  case "$image" in
    jq | javascript | python | probe) ;;
    *) echo "build-images.sh: unknown image '$image' (jq, javascript, python, probe)" >&2; exit 2 ;;
  esac
done

log() { printf '== %s\n' "$*" >&2; }
has_image() { local i; for i in "${images[@]}"; do [ "$i" = "$1" ] && return 0; done; return 1; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# --- toolchains ----------------------------------------------------------------

ensure_rust_target() {
  # rustup resolves the toolchain from rust-toolchain.toml at the repository root
  if ! (cd "$ROOT" && rustup target list --installed) | grep -qx wasm32-wasip1; then
    log "rustup target add wasm32-wasip1"
    (cd "$ROOT" && rustup target add wasm32-wasip1)
  fi
}

ensure_apt_packages() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

ensure_componentize_py() {
  # The script itself must run: a venv made under another path has scripts
  # whose first line names a python that is gone.
  if "$VENV/bin/componentize-py" --version >/dev/null 2>&1 &&
    "$VENV/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(not m.version("componentize-py").startswith("0.25."))' 2>/dev/null; then
    return
  fi
  log "venv with componentize-py $COMPONENTIZE_PY_VERSION in ${VENV#"$ROOT"/}"
  if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
    ensure_apt_packages python3-venv
  fi
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "componentize-py==$COMPONENTIZE_PY_VERSION"
}

# --- helpers -------------------------------------------------------------------

# install FILE as sandbox-images/NAME.wasm, leaving it untouched when equal
install_wasm() {
  local from="$1" name="$2"
  if ! cmp -s "$from" "$OUT/$name.wasm"; then
    cp "$from" "$OUT/$name.wasm.tmp"
    mv "$OUT/$name.wasm.tmp" "$OUT/$name.wasm"
  fi
}

# sandbox-images/NAME.json: guest/NAME/manifest.json with the sha256 of NAME.wasm
write_manifest() {
  local name="$1" sha
  sha="$(sha256sum "$OUT/$name.wasm" | cut -d' ' -f1)"
  grep -q '"sha256": ""' "$GUEST/$name/manifest.json" || {
    echo "build-images.sh: guest/$name/manifest.json has no \"sha256\": \"\" to fill" >&2
    exit 1
  }
  sed "s/\"sha256\": \"\"/\"sha256\": \"$sha\"/" "$GUEST/$name/manifest.json" >"$OUT/$name.json.tmp"
  mv "$OUT/$name.json.tmp" "$OUT/$name.json"
}

report() {
  local name="$1" started="$2"
  log "$name: sandbox-images/$name.wasm, $(stat -c %s "$OUT/$name.wasm") bytes, $(($(date +%s) - started)) s"
}

# pre-initialize FILE into FILE.wizer.wasm with examples/wizer.rs (built by cargo with
# the server's own wasmtime, from crates.io like every other dependency)
wizen() {
  local from="$1"
  (cd "$ROOT" && "${NICE[@]}" cargo run --locked --quiet --example wizer -- "$from" "${from%.wasm}.wizer.wasm")
}

cargo_build() {
  local dir="$1"
  (cd "$dir" && "${NICE[@]}" cargo build --release --locked --quiet --target wasm32-wasip1 --target-dir "$TARGET_DIR")
}

# --- images --------------------------------------------------------------------

build_jq() {
  local started
  started=$(date +%s)
  log "jq (jaq, wasm32-wasip1)"
  cargo_build "$GUEST/jq"
  wizen "$TARGET_DIR/wasm32-wasip1/release/jq.wasm"
  install_wasm "$TARGET_DIR/wasm32-wasip1/release/jq.wizer.wasm" jq
  write_manifest jq
  report jq "$started"
}

build_javascript() {
  local started sysroot
  started=$(date +%s)
  log "javascript (rquickjs, wasm32-wasip1)"
  ensure_apt_packages "${APT_PACKAGES[@]}"
  # A sysroot of symlinks to Debian's wasi-libc, laid out as clang 14 expects it.
  sysroot="$BUILD/wasi-sysroot"
  mkdir -p "$sysroot/include" "$sysroot/lib"
  ln -sfn /usr/include/wasm32-wasi "$sysroot/include/wasm32-wasi"
  ln -sfn /usr/lib/wasm32-wasi "$sysroot/lib/wasm32-wasi"
  local cc="$GUEST/javascript/cc-wasm32-wasip1.sh"
  # The wrapper's hash, as a harmless define: rquickjs-sys rebuilds when the wrapper changes.
  RQUICKJS_SYS_NO_WASI_SDK=1 \
    WASI_SYSROOT="$sysroot" \
    CC_wasm32_wasip1="$cc" \
    AR_wasm32_wasip1=llvm-ar-14 \
    CFLAGS_wasm32_wasip1="-DSPILLWAY_CC=$(sha256sum "$cc" | cut -c1-16)" \
    cargo_build "$GUEST/javascript"
  wizen "$TARGET_DIR/wasm32-wasip1/release/javascript.wasm"
  install_wasm "$TARGET_DIR/wasm32-wasip1/release/javascript.wizer.wasm" javascript
  write_manifest javascript
  report javascript "$started"
}

build_python() {
  local started dir="$GUEST/python" hash stamp="$BUILD/python.inputs.sha256"
  started=$(date +%s)
  log "python (componentize-py, wasi:cli/command component)"
  ensure_componentize_py
  # inputs: the runner app, the WIT and componentize-py's version
  hash="$(
    {
      (cd "$dir" && find app wit -type f \( -name '*.py' -o -name '*.wit' \) | LC_ALL=C sort | xargs sha256sum)
      "$VENV/bin/componentize-py" --version
    } | sha256sum | cut -d' ' -f1
  )"
  if [ -f "$OUT/python.wasm" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$hash" ]; then
    log "python: up to date"
  else
    rm -f "$stamp"
    # Only the app directory on the Python path (-p); VIRTUAL_ENV unset so that no
    # site-packages is added. componentize-py pre-initializes the app: see README.
    (cd "$dir" && env -u VIRTUAL_ENV "${NICE[@]}" "$VENV/bin/componentize-py" --quiet \
      -d wit -w runner componentize spillway_runner -p app -o "$BUILD/python.wasm")
    install_wasm "$BUILD/python.wasm" python
    echo "$hash" >"$stamp"
  fi
  write_manifest python
  report python "$started"
}

# The probe is no runtime image: the tests and benches send it as a `wasm`
# module (escape attempts, limit hits, a native-Rust aggregation). No manifest.
build_probe() {
  local started
  started=$(date +%s)
  log "probe (test guest, wasm32-wasip1)"
  cargo_build "$GUEST/probe"
  install_wasm "$TARGET_DIR/wasm32-wasip1/release/spillway-probe.wasm" probe
  report probe "$started"
}

if has_image jq || has_image javascript || has_image probe; then ensure_rust_target; fi
for image in "${images[@]}"; do
  "build_$image"
done
