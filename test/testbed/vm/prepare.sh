#!/bin/bash
# Prepares the test bed's guest assets in a cache directory and prints that directory.
#
# Usage: prepare.sh CACHE_DIR
#
# The guest boots Debian's own kernel (the one linux-image-amd64 depends on) with
# rdma_rxe from Debian and siw built out of tree from Debian's matching kernel
# source, because Debian's kernel does not enable CONFIG_RDMA_SIW. Nothing is
# installed on the host: packages are fetched with `apt-get download` and
# unpacked with `dpkg-deb -x`. Every step is skipped when its output exists, so
# a warm cache costs a few milliseconds. Concurrent callers (go test -exec runs
# package binaries in parallel) serialise on a lock file.
set -euo pipefail

cache=${1:?usage: prepare.sh CACHE_DIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)

say() { echo "testbed: $*" >&2; }
die() { echo "testbed: error: $*" >&2; exit 1; }

exec 9>"$cache/.lock"
flock 9
# What an interrupted run left (its EXIT trap never ran under SIGKILL).
rm -rf "$cache"/.work.* "$cache"/.initramfs.*

# Modules the guest loads after switching root (dependencies are added below).
guest_modules="crc32_generic crc32c_generic virtio_net virtio_console rdma_rxe rdma_ucm ib_uverbs ib_umad veth dummy 8021q macvlan bonding"
# Modules the initramfs needs to mount the host's file system over 9p.
initrd_modules="virtio_pci 9pnet_virtio 9p overlay"

# A prepared kernel is kept only if this script prepared it: its hash is
# the recipe, so a change to how siw or the modules are built rebuilds them.
recipe=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)
prepared() { [ -e "$1/ready" ] && [ "$(cat "$1/recipe" 2>/dev/null)" = "$recipe" ]; }

# Which kernel: a prepared one if the cache has it (a kernel update in the
# package lists does not rebuild the test bed, nor pull assets from under a
# guest that runs), else the one linux-image-amd64 depends on today.
# RDMAGO_TESTBED_REFRESH=1 takes today's even when one is prepared. A kernel
# prepared by another version of this script is prepared again, the same
# kernel version.
if [ -e "$cache/current/ready" ] && [ "${RDMAGO_TESTBED_REFRESH:-}" != 1 ]; then
	out=$(readlink -f "$cache/current")
	kver=$(cat "$out/kver")
	version=$(basename "$out")
	version=${version#"$kver-"}
else
	pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -n1 || true)
	[ -n "$pkg" ] || die "cannot tell which kernel linux-image-amd64 depends on: run 'apt-get update' first"
	kver=${pkg#linux-image-}
	version=$(apt-cache policy "$pkg" | sed -n 's/^ *Candidate: //p')
	[ -n "$version" ] && [ "$version" != "(none)" ] || die "no candidate version for $pkg"
	out="$cache/$kver-$version"
fi

if ! prepared "$out"; then
	kept=""
	if [ -e "$out/ready" ]; then
		kept=$out
		say "the guest kernel in $out was prepared by another version of prepare.sh: preparing it again"
	fi
	say "preparing guest kernel $kver ($version) in $out (first run only)"
	# Built aside and moved into place at the end: a failed build leaves
	# a kept one as it was.
	work=$(mktemp -d "$cache/.work.XXXXXX")
	trap 'rm -rf "$work"' EXIT
	new="$work/out"
	mkdir -p "$new"
	flavour=${kver##*-}                     # amd64
	series=$(echo "$kver" | cut -d. -f1,2)  # 6.1
	debs="linux-image-$kver linux-headers-$kver linux-headers-${kver%-$flavour}-common linux-kbuild-$series linux-source-$series"
	say "downloading $(echo $debs | wc -w) kernel packages (about 220 MB)"
	if ! (cd "$work" && for d in $debs; do apt-get download -q "$d=$version" >/dev/null 2>&1 || apt-get download "$d=$version"; done); then
		[ -n "$kept" ] || die "apt-get download failed for: $debs (the package lists may name a kernel the archive no longer has: run 'sudo apt-get update')"
		say "warning: cannot download $kver ($version) again; keeping the guest kernel prepared by another version of prepare.sh (RDMAGO_TESTBED_REFRESH=1 prepares today's)"
	else
		say "unpacking"
		mkdir -p "$work/root"
		for f in "$work"/*.deb; do dpkg-deb -x "$f" "$work/root"; done

		say "extracting siw sources and extract-vmlinux from linux-source-$series"
		tar -C "$work" -xJf "$work/root/usr/src/linux-source-$series.tar.xz" \
			"linux-source-$series/drivers/infiniband/sw/siw" "linux-source-$series/scripts/extract-vmlinux"
		src="$work/linux-source-$series"

		say "extracting an uncompressed vmlinux (skips the slow decompressor under emulation)"
		sh "$src/scripts/extract-vmlinux" "$work/root/boot/vmlinuz-$kver" >"$new/vmlinux"

		say "building siw.ko against linux-headers-$kver"
		# The headers' Makefile includes the common tree by absolute path; point it at our copy.
		hdr="$work/root/usr/src/linux-headers-$kver"
		sed -i "s|include /usr/src/|include $work/root/usr/src/|" "$hdr/Makefile"
		make -s -C "$hdr" M="$src/drivers/infiniband/sw/siw" CONFIG_RDMA_SIW=m modules -j"$(nproc)" >"$work/siw-build.log" 2>&1 \
			|| { cat "$work/siw-build.log" >&2; die "building siw failed"; }

		say "collecting modules"
		mods="$work/root/lib/modules/$kver"
		mkdir -p "$mods/extra"
		cp "$src/drivers/infiniband/sw/siw/siw.ko" "$mods/extra/siw.ko"
		depmod -b "$work/root" "$kver"
		dest="$new/modules/lib/modules/$kver"
		for m in siw $guest_modules $initrd_modules; do
			modprobe -d "$work/root" -S "$kver" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
		done | sort -u | while read -r ko; do
			rel=${ko#"$mods/"}
			mkdir -p "$dest/$(dirname "$rel")"
			cp "$ko" "$dest/$rel"
		done
		cp "$mods/modules.order" "$mods/modules.builtin" "$mods/modules.builtin.modinfo" "$dest/"
		depmod -b "$new/modules" "$kver"

		# Stage-one modules in load order, for the initramfs.
		for m in $initrd_modules; do
			modprobe -d "$new/modules" -S "$kver" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
		done | awk '!seen[$0]++' | sed "s|^$new/modules/||" >"$new/initrd-modules"
		echo "$kver" >"$new/kver"
		echo "$recipe" >"$new/recipe"
		touch "$new/ready"
		rm -rf "$out"
		mv "$new" "$out"
	fi
	rm -rf "$work"
	trap - EXIT
	ln -sfn "$(basename "$out")" "$cache/current"
	# Older kernels' assets are no longer used.
	find "$cache" -mindepth 1 -maxdepth 1 -type d -name '*-*' ! -name "$(basename "$out")" -exec rm -rf {} +
	say "guest kernel ready"
fi

# The initramfs is rebuilt whenever its init script changes (it is cheap).
if [ ! -e "$out/initramfs.cpio.gz" ] || [ "$here/init" -nt "$out/initramfs.cpio.gz" ]; then
	ir=$(mktemp -d "$cache/.initramfs.XXXXXX")
	mkdir -p "$ir/bin" "$ir/proc" "$ir/sys" "$ir/dev" "$ir/host" "$ir/newroot" "$ir/rw"
	cp /bin/busybox "$ir/bin/busybox" || die "static busybox missing: apt-get install busybox-static"
	cp "$here/init" "$ir/init"
	chmod 755 "$ir/init"
	while read -r rel; do
		mkdir -p "$ir/$(dirname "$rel")"
		cp "$out/modules/$rel" "$ir/$rel"
	done <"$out/initrd-modules"
	cp "$out/initrd-modules" "$ir/modules.load"
	(cd "$ir" && find . | cpio -o -H newc --quiet | gzip -1) >"$out/initramfs.cpio.gz.tmp"
	mv "$out/initramfs.cpio.gz.tmp" "$out/initramfs.cpio.gz"
	rm -rf "$ir"
fi
ln -sfn "$(basename "$out")" "$cache/current"
echo "$out"
