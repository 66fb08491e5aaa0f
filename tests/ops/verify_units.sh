#!/usr/bin/env bash
# The systemd units of ops/systemd as systemd itself reads them: `systemd-analyze verify` of an
# instance of each, in a throwaway root that holds the command at the path the units run it from
# (/usr/bin/retryloop), its man pages, and this machine's own units (for the targets the units
# name); then `systemd-analyze security`, which must rate each one's exposure at most 2.0 ("OK").
#
#   verify_units.sh UNITS_DIR RETRYLOOP MAN_DIR
set -euo pipefail

units=${1:?units directory} retryloop=${2:?retryloop command} man=${3:?man pages directory}
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/bin" "$root/usr/share/man/man1" "$root/usr/lib/systemd" "$root/etc/systemd/system"
cp "$retryloop" "$root/usr/bin/retryloop"
cp "$man"/*.1 "$root/usr/share/man/man1/"
cp -a /usr/lib/systemd/system "$root/usr/lib/systemd/"
cp "$units"/*@.service "$root/usr/lib/systemd/system/"

status=0
for template in "$units"/*@.service; do
  name=$(basename "$template")
  instance=${name/@/@demo}
  # The units' Documentation= pages are looked up with man, in the root's pages. verify exits 0
  # on a key it does not know (it ignores it, as systemd would): any message is a failure.
  if output=$(MANPATH=$root/usr/share/man systemd-analyze verify --root="$root" "$instance" 2>&1) &&
    [[ -z $output ]]; then
    echo "verified: $instance"
  else
    echo "FAILED: systemd-analyze verify $instance: $output"
    status=1
  fi
  cp "$template" "$root/$instance"
  exposure=$(systemd-analyze security --offline=yes --root="$root" "$root/$instance" 2>/dev/null |
    sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
  if [[ -n $exposure ]] && awk -v e="$exposure" 'BEGIN { exit !(e <= 2.0) }'; then
    echo "exposure of $instance: $exposure (at most 2.0)"
  else
    echo "FAILED: exposure of $instance is ${exposure:-unknown}, above 2.0"
    status=1
  fi
done
exit "$status"
