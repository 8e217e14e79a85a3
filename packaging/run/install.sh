#!/bin/sh
# qmgui's per-user installer, run by the self-extracting .run (makeself) from the extracted
# folder: the app to PREFIX/opt/qmgui, a launcher PREFIX/bin/qmgui, the menu entry, icons and
# AppStream data under PREFIX/share. PREFIX is ~/.local unless --prefix says otherwise. No root.
# Installing again (a newer .run) replaces the app and keeps the settings (~/.config/qmgui).
set -eu
usage() {
  cat <<USAGE
usage: qmgui-*.run [-- --prefix DIR]
  Installs qmgui for this user (default prefix: ~/.local; no root needed):
    DIR/opt/qmgui/            the application
    DIR/bin/qmgui             the launcher
    DIR/share/applications/   the menu entry, DIR/share/icons/hicolor/ the icons
  Uninstall: DIR/opt/qmgui/uninstall.sh  (--purge also removes settings and caches)
USAGE
}
PREFIX=${HOME:?}/.local
while [ $# -gt 0 ]; do
  case $1 in
    --prefix) PREFIX=${2:?--prefix needs a folder}; shift 2 ;;
    --prefix=*) PREFIX=${1#--prefix=}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "qmgui install: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
case $PREFIX in /*) ;; *) PREFIX=$(pwd -P)/$PREFIX ;; esac
APP=$PREFIX/opt/qmgui
BIN=$PREFIX/bin
DATA=$PREFIX/share
here=$(cd "$(dirname "$0")" && pwd -P)

# the application: copy beside, then swap, so a failed copy leaves the old version working
mkdir -p "$PREFIX/opt" "$BIN"
rm -rf "$APP.new"
cp -R "$here/qmgui" "$APP.new"
cp "$here/uninstall.sh" "$APP.new/uninstall.sh"
if [ -f "$APP/installed-files" ]; then  # an older install: drop its menu entry and icons
  "$APP/uninstall.sh" --files-only || true
fi
rm -rf "$APP"
mv "$APP.new" "$APP"
mkdir -p "$BIN"  # again: removing the old install's launcher may have removed an empty BIN

manifest=$APP/installed-files
: >"$manifest"
put() {  # put SRC DEST: install one file and record it for the uninstaller
  mkdir -p "$(dirname "$2")"
  cp "$1" "$2"
  chmod 644 "$2"
  echo "$2" >>"$manifest"
}
ln -sfn "$APP/qmgui" "$BIN/qmgui"
echo "$BIN/qmgui" >>"$manifest"
if [ "$DATA" = "${XDG_DATA_HOME:-$HOME/.local/share}" ]; then
  icon=qmgui  # found through the icon theme (XDG_DATA_HOME/icons/hicolor)
else
  icon=$DATA/icons/hicolor/256x256/apps/qmgui.png  # a folder desktops don't search
fi
mkdir -p "$DATA/applications"
sed -e "s|^Exec=qmgui|Exec=\"$APP/qmgui\"|" -e "s|^TryExec=qmgui|TryExec=$APP/qmgui|" \
    -e "s|^Icon=qmgui|Icon=$icon|" "$here/share/applications/qmgui.desktop" \
    >"$DATA/applications/qmgui.desktop"
chmod 644 "$DATA/applications/qmgui.desktop"
echo "$DATA/applications/qmgui.desktop" >>"$manifest"
put "$here/share/metainfo/qmgui.metainfo.xml" "$DATA/metainfo/qmgui.metainfo.xml"
for f in "$here"/share/icons/hicolor/*/apps/qmgui.*; do
  put "$f" "$DATA/icons/hicolor/${f#"$here"/share/icons/hicolor/}"
done
touch "$DATA/icons/hicolor" 2>/dev/null || true  # icon theme caches notice the change

echo "qmgui installed in $APP"
echo "  start it from the applications menu, or: $BIN/qmgui"
echo "  uninstall: $APP/uninstall.sh"
case ":$PATH:" in *":$BIN:"*) ;; *) echo "  ($BIN is not on your PATH)" ;; esac
