#!/usr/bin/env bash
# libfaketime for the soak's clock faults (`make soak`): Debian's faketime, installed with
# apt-get when it is missing. Only one apt process may run at a time on a machine: a locked
# dpkg is waited for (retried), never forced. Where it cannot be installed (no root, no
# network), the soak runs without it and prints `skipped:` for its clock faults.
set -u

LIB=/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1

if [ -e "$LIB" ] || dpkg -s faketime >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  SUDO=(sudo -n)
else
  echo "faketime is not installed and apt-get needs root: the soak's clock faults will be skipped"
  exit 0
fi
updated=0
for attempt in 1 2 3 4 5 6 7 8 9 10 11 12; do
  out=$("${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q faketime 2>&1) && {
    echo "installed Debian's faketime (libfaketime) for the soak's clock faults"
    exit 0
  }
  if grep -q "Could not get lock\|Unable to acquire the dpkg" <<<"$out"; then
    echo "apt is busy (another apt process holds its lock); retrying in 10 s ($attempt/12)"
    sleep 10
  elif [ "$updated" -eq 0 ]; then
    updated=1
    "${SUDO[@]}" apt-get update -q >/dev/null 2>&1 || true
  else
    break
  fi
done
echo "faketime could not be installed: the soak's clock faults will be skipped"
printf '%s\n' "$out" | tail -3
exit 0
