# Payload steps for tests/vm/run (sourced): the host-built test binaries, as an extra archive
# appended to the cached image (the kernel unpacks concatenated cpio archives in order).

# Build the verbs test binaries with the ibv provider; cargo's JSON names their paths.
build_tests() {
  cd "$ROOT"
  cargo test -p rpcrdma-verbs --features ibv --no-run
  cargo test -p rpcrdma-verbs --features ibv --no-run --message-format=json > "$OUT/cargo.json"
}

# /payload/bin/<test> (debug info stripped) and /payload/run, appended to the image.
pack_payload() {
  local p=$OUT/payload t exe
  rm -rf "$p"; mkdir -p "$p/payload/bin"
  for t in ibv_conformance ibv_open ibv_siw_interop; do
    exe=$(grep -F "\"name\":\"$t\"" "$OUT/cargo.json" | grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | tail -1)
    [ -n "$exe" ] && [ -x "$exe" ] || { echo "no test binary $t"; return 1; }
    objcopy --strip-debug "$exe" "$p/payload/bin/$t"
  done
  install -m755 "$HERE/guest/payload-run" "$p/payload/run"
  ( cd "$p" && find . -print0 | cpio --null -o -H newc --quiet ) > "$OUT/payload.cpio"
  cat "$IMAGE/rootfs.cpio" "$OUT/payload.cpio" > "$OUT/initrd.cpio"
  rm -rf "$p"
}
