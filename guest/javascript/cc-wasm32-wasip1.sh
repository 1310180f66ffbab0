#!/usr/bin/env bash
# C compiler for rquickjs-sys on wasm32-wasip1, with Debian's clang-14 and wasi-libc
# (no wasi-sdk download). clang 14 knows the target as wasm32-wasi; the sysroot is a
# directory of symlinks to Debian's wasi-libc, made by guest/build-images.sh and
# passed in WASI_SYSROOT.
#
# One source change: QuickJS-ng turns its stack-overflow check off on WASI
# (update_stack_limit: `#if defined(__wasi__) rt->stack_limit = 0`), so deep
# recursion runs off the end of the shadow stack and traps. quickjs.c is compiled
# from a copy without that branch; src/main.rs then sets the limit, and deep
# recursion is a catchable RangeError.
#
# One addition: spillway_js_seed_random(ctx, seed), appended to the copy, sets the
# context's Math.random state (a private field). The image is pre-initialized
# (Wizer) with its context made at build time, so each run reseeds it.
set -euo pipefail
args=()
for a in "$@"; do
  case "$a" in
    --target=wasm32-wasip1) args+=(--target=wasm32-wasi) ;;
    wasm32-wasip1) args+=(wasm32-wasi) ;;
    */quickjs.c)
      patched="${a%.c}-spillway.c"
      perl -0pe 's{#if defined\(__wasi__\)\n(\s*rt->stack_limit = 0; /\* no limit \*/\n)#else\n(.*?)#endif}{$2}s' "$a" >"$patched"
      if cmp -s "$a" "$patched"; then
        echo "cc-wasm32-wasip1.sh: the QuickJS stack-limit patch no longer applies to $a" >&2
        exit 1
      fi
      cat >>"$patched" <<'EOF'

/* Spillway: reseed Math.random (the context was made at image build time). */
void spillway_js_seed_random(JSContext *ctx, uint64_t seed)
{
    ctx->random_state = seed ? seed : 1;
}
EOF
      args+=("$patched")
      ;;
    *) args+=("$a") ;;
  esac
done
exec "${CLANG:-clang-14}" --sysroot="${WASI_SYSROOT:?WASI_SYSROOT is not set}" "${args[@]}"
