# Payload steps for tests/vm/run (sourced): the host-built test binaries, as an extra archive
# appended to the cached image (the kernel unpacks concatenated cpio archives in order).

# Build the verbs test binaries with the ibv provider; cargo's JSON names their paths.
# Parts (RPCRDMA_VM_PAYLOAD, default ibv,nfs): ibv = the verbs test binaries; nfs = rpcrdmad,
# rpcrdmactl, nfs-probe, shm-testapp, rpcrdma-bench, the C example apps.
has_part() { case ",${PARTS:-ibv,nfs}," in *",$1,"*) return 0 ;; esac; return 1; }
build_tests() {
  cd "$ROOT"
  if has_part ibv; then
    cargo test -p rpcrdma-verbs --features ibv --no-run
    cargo test -p rpcrdma-verbs --features ibv --no-run --message-format=json > "$OUT/cargo.json"
  fi
  has_part nfs || return 0
  local b=(-p rpcrdma-control -p rpcrdma-nfsprobe -p rpcrdma-shm -p rpcrdma-bench --features rpcrdma-control/ibv --bins)
  cargo build "${b[@]}"
  cargo build "${b[@]}" --message-format=json > "$OUT/cargo-bins.json"
}

# /payload/bin/<test> (debug info stripped) and /payload/run, appended to the image.
pack_payload() {
  local p=$OUT/payload t exe
  rm -rf "$p"; mkdir -p "$p/payload/bin"
  has_part ibv && for t in ibv_conformance ibv_open ibv_port ibv_siw_interop; do
    exe=$(grep -F "\"name\":\"$t\"" "$OUT/cargo.json" | grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | tail -1)
    [ -n "$exe" ] && [ -x "$exe" ] || { echo "no test binary $t"; return 1; }
    objcopy --strip-debug "$exe" "$p/payload/bin/$t"
  done
  has_part nfs && mkdir -p "$p/payload/nfs" && for t in rpcrdmad rpcrdmactl nfs-probe shm-testapp rpcrdma-bench; do
    exe=$(grep -F "\"name\":\"$t\"" "$OUT/cargo-bins.json" | grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | tail -1)
    [ -n "$exe" ] && [ -x "$exe" ] || { echo "no binary $t"; return 1; }
    objcopy --strip-debug "$exe" "$p/payload/nfs/$t"
  done
  has_part nfs && install -m644 "$HERE"/nfs-*.toml "$HERE"/daemon-*.toml "$HERE"/pair-*.toml "$p/payload/nfs/"
  # The C example apps (shm-api/examples/c) for the daemon pair.
  has_part nfs && for t in client server; do
    ${CC:-cc} -std=c11 -O2 -Wall -Werror -I "$ROOT/shm-api/include" "$ROOT/shm-api/examples/c/$t.c" \
      -o "$p/payload/nfs/rdmatest-$t" || return 1
  done
  install -m755 "$HERE/guest/payload-run" "$p/payload/run"
  ( cd "$p" && find . -print0 | cpio --null -o -H newc --quiet ) > "$OUT/payload.cpio"
  cat "$IMAGE/rootfs.cpio" "$OUT/payload.cpio" > "$OUT/initrd.cpio"
  rm -rf "$p"
}
