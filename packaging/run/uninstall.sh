#!/bin/sh
# Remove a per-user qmgui install (made by the .run): the files its installer recorded, the
# folders that became empty, the application folder. Settings and caches stay unless --purge.
set -eu
APP=$(cd "$(dirname "$0")" && pwd -P)
PREFIX=$(dirname "$(dirname "$APP")")  # APP is PREFIX/opt/qmgui; empty folders go up to it
files_only=false purge=false
for a in "$@"; do
  case $a in
    --files-only) files_only=true ;;  # the installer, before it replaces an older version
    --purge) purge=true ;;
    -h|--help) echo "usage: $0 [--purge]   (--purge: also settings and caches)"; exit 0 ;;
    *) echo "qmgui uninstall: unknown option $a" >&2; exit 2 ;;
  esac
done
[ -f "$APP/installed-files" ] && [ -x "$APP/qmgui" ] || {
  echo "qmgui uninstall: $APP does not look like a qmgui install" >&2; exit 1; }
while IFS= read -r f; do
  case $f in /*) ;; *) continue ;; esac
  if [ -L "$f" ] || [ -f "$f" ]; then rm -f "$f"; fi
  d=$(dirname "$f")
  while [ "$d" != "$PREFIX" ] && [ "$d" != / ] && rmdir "$d" 2>/dev/null; do d=$(dirname "$d"); done
done <"$APP/installed-files"
$files_only && exit 0
rm -rf "$APP"
rmdir "$(dirname "$APP")" 2>/dev/null || true
if $purge; then
  rm -rf "${QMGUI_CONFIG_DIR:-${XDG_CONFIG_HOME:-$HOME/.config}/qmgui}" \
         "${QMGUI_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/qmgui}"
  echo "qmgui removed, with its settings and caches"
else
  echo "qmgui removed (settings kept in ${XDG_CONFIG_HOME:-$HOME/.config}/qmgui; --purge removes them)"
fi
