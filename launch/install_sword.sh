#!/usr/bin/env bash
# Installs the SWORD Bible modules (Debian packages sword-text-sparv, sword-text-web) when absent.
# With SWORD_OPTIONAL=1 a failed install only warns (the tests that need them then skip).
set -u
modules=(spaRV1909eb engWEB2015eb)
dirs=("${SWORD_PATH:-}" /usr/share/sword "$HOME/.sword")
have_all=1
for m in "${modules[@]}"; do
  found=0
  for d in "${dirs[@]}"; do
    [ -n "$d" ] && [ -f "$d/mods.d/$m.conf" ] && found=1
  done
  [ "$found" = 1 ] || have_all=0
done
[ "$have_all" = 1 ] && exit 0

cmd="apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq sword-text-sparv sword-text-web"
echo "SWORD modules ${modules[*]} missing: installing sword-text-sparv sword-text-web" >&2
if [ "$(id -u)" = 0 ]; then
  bash -c "$cmd" >/dev/null && exit 0
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo bash -c "$cmd" >/dev/null && exit 0
fi
msg="could not install the SWORD modules; run as root: apt-get install -y sword-text-sparv sword-text-web"
if [ "${SWORD_OPTIONAL:-0}" = 1 ]; then
  echo "WARNING: $msg (tests that read them will skip)" >&2
  exit 0
fi
echo "ERROR: $msg" >&2
exit 1
