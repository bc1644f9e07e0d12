# Image build steps for tests/vm/run (sourced). Each function works inside $WORK and is run with a
# timeout by the caller; together they produce $1/vmlinuz and $1/rootfs.cpio.
# Needs root (debootstrap, chroot), dpkg, apt-get, gcc, make, cpio, network access to $MIRROR.

# A Debian $SUITE root with $GUEST_PKGS, daemons prevented from starting in the chroot.
image_rootfs() {
  local r=$WORK/rootfs
  rm -rf "$r"; mkdir -p "$r"
  debootstrap --variant=minbase "$SUITE" "$r" "$MIRROR"
  printf '#!/bin/sh\nexit 101\n' > "$r/usr/sbin/policy-rc.d"; chmod +x "$r/usr/sbin/policy-rc.d"
  chroot "$r" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $GUEST_PKGS
  chroot "$r" apt-get clean
  rm -rf "$r"/var/lib/apt/lists/* "$r"/usr/share/doc/* "$r"/usr/share/man/* "$r"/usr/share/locale/*
}

# Debian's kernel package, unpacked (never installed on the host); modules go into the root.
image_kernel() {
  local d=$WORK/debs r=$WORK/rootfs kv=$KABI-amd64
  mkdir -p "$d"; ( cd "$d" && apt-get download "linux-image-$kv" )
  rm -rf "$WORK/kernel"; dpkg -x "$d"/linux-image-${kv}_*.deb "$WORK/kernel"
  cp "$WORK/kernel/boot/vmlinuz-$kv" "$WORK/vmlinuz"
  rm -rf "$r/lib/modules/$kv"; mkdir -p "$r/lib/modules"
  cp -a "$WORK/kernel/lib/modules/$kv" "$r/lib/modules/"
}

# siw.ko: Debian builds its kernels without CONFIG_RDMA_SIW, so build the module out of tree from
# the matching linux-source against the unpacked headers (their absolute paths re-pointed).
image_siw() {
  local d=$WORK/debs b=$WORK/siw kv=$KABI-amd64
  ( cd "$d" && apt-get download "linux-source-6.1=$KSRC_VERSION" "linux-headers-$kv" \
      "linux-headers-$KABI-common" "linux-kbuild-6.1" )
  rm -rf "$b"; mkdir -p "$b/root"
  for f in "$d"/linux-headers-*.deb "$d"/linux-kbuild-6.1_*.deb; do dpkg -x "$f" "$b/root"; done
  find "$b/root" -type l | while read -r l; do
    t=$(readlink "$l"); case $t in /*) ln -sfn "$b/root$t" "$l" ;; esac
  done
  grep -rl '/usr/src/' "$b"/root/usr/src/linux-headers-*/ --include=Makefile \
    | xargs -r sed -i "s|\([ \"]\)/usr/src/|\1$b/root/usr/src/|g"
  dpkg --fsys-tarfile "$d"/linux-source-6.1_*.deb \
    | tar -xO ./usr/src/linux-source-6.1.tar.xz \
    | tar -xJ -C "$b" linux-source-6.1/drivers/infiniband/sw/siw
  make -s -C "$b/root/usr/src/linux-headers-$kv" M="$b/linux-source-6.1/drivers/infiniband/sw/siw" \
    CONFIG_RDMA_SIW=m modules
  mkdir -p "$WORK/rootfs/lib/modules/$kv/extra"
  cp "$b/linux-source-6.1/drivers/infiniband/sw/siw/siw.ko" "$WORK/rootfs/lib/modules/$kv/extra/"
}

# The initramfs: the root with only the modules the guest needs, guest/init as /init.
image_pack() {
  local r=$WORK/rootfs s=$WORK/stage kv=$KABI-amd64 out=$1
  chroot "$r" depmod -a "$kv"
  rm -rf "$s"; cp -al "$r" "$s"
  rm -rf "$s/lib/modules/$kv"; mkdir -p "$s/lib/modules/$kv"
  cp -a "$r/lib/modules/$kv"/modules.builtin* "$r/lib/modules/$kv/modules.order" "$s/lib/modules/$kv/"
  local m
  for m in $GUEST_MODS; do
    chroot "$r" modprobe -S "$kv" --show-depends "$m" || { echo "module $m missing" >&2; return 1; }
  done | awk '$1=="insmod"{print $2}' | sort -u | while read -r f; do
    mkdir -p "$s$(dirname "$f")"; cp -a "$r$f" "$s$f"
  done
  # request_module() helpers: rxe needs the crc32 crypto modules or `rdma link add` fails.
  for m in kernel/crypto kernel/arch/x86/crypto kernel/lib; do
    mkdir -p "$s/lib/modules/$kv/$(dirname $m)"; cp -a "$r/lib/modules/$kv/$m" "$s/lib/modules/$kv/$m"
  done
  chroot "$s" depmod -a "$kv"
  rm -f "$s/usr/sbin/policy-rc.d"
  install -m755 "$HERE/guest/init" "$s/init"
  mkdir -p "$out"
  ( cd "$s" && find . -print0 | cpio --null -o -H newc --quiet ) > "$out/rootfs.cpio.tmp"
  cp "$WORK/vmlinuz" "$out/vmlinuz.tmp"
  mv "$out/rootfs.cpio.tmp" "$out/rootfs.cpio"; mv "$out/vmlinuz.tmp" "$out/vmlinuz"
  rm -rf "$s"
}

# qemu-system-x86_64: the host's if installed; else Debian's package and its missing
# dependencies unpacked (not installed) into $1, for hosts where installing it conflicts.
qemu_unpack() {
  local q=$1 d=$1.debs pkgs p
  rm -rf "$q" "$d"; mkdir -p "$d"
  pkgs=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
           --no-replaces --no-enhances --no-pre-depends qemu-system-x86 | grep -v '^ \|<' | sort -u)
  ( cd "$d" && for p in $pkgs; do
      dpkg -s "$p" >/dev/null 2>&1 && [ "$p" != qemu-system-x86 ] || echo "$p"
    done | xargs apt-get download )
  for p in "$d"/*.deb; do dpkg -x "$p" "$q"; done
  rm -rf "$d"
}
