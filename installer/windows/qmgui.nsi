; qmgui's Windows installer: per user, no administrator rights.
;
;   makensis -DVERSION=0.1.0 -DBUNDLE=..\..\dist\qmgui -DOUTFILE=..\..\dist\qmgui-0.1.0-setup.exe qmgui.nsi
;   (packaging/build nsis does this; BUNDLE is PyInstaller's one-folder dist/qmgui)
;
; Installs to %LOCALAPPDATA%\Programs\qmgui; a Start-menu shortcut; optional desktop shortcut
; and "start with Windows" (HKCU Run, `qmgui.exe --minimized`: the tray); an uninstaller in
; Apps & Features (HKCU). Installing a newer version over an older one replaces the program
; files and keeps every choice. Settings and caches live elsewhere (%LOCALAPPDATA%\qmgui,
; platformdirs) and neither the installer nor the uninstaller touches them.
;
; Silent: setup.exe /S [/DESKTOP=0|1] [/AUTOSTART=0|1] [/D=folder]  (the last option, no quotes)
; Uninstall silently: "%LOCALAPPDATA%\Programs\qmgui\uninstall.exe" /S

Unicode true
; PySide6 is 64-bit only: a 64-bit installer where makensis has the stubs (Debian's does; the
; official Windows build has only x86 ones, which work as well for a per-user install)
!if /FileExists "${NSISDIR}/Stubs/lzma_solid-amd64-unicode"
  Target amd64-unicode
!endif

!ifndef VERSION
  !define VERSION 0.0.0
!endif
!ifndef BUNDLE
  !define BUNDLE ..\..\dist\qmgui
!endif
!ifndef OUTFILE
  !define OUTFILE ..\..\dist\qmgui-${VERSION}-setup.exe
!endif
!define APP qmgui
!define EXE qmgui.exe
!define UNINST_KEY "Software\Microsoft\Windows\CurrentVersion\Uninstall\${APP}"
!define RUN_KEY "Software\Microsoft\Windows\CurrentVersion\Run"
!define APP_PATHS_KEY "Software\Microsoft\Windows\CurrentVersion\App Paths\${EXE}"

!include "MUI2.nsh"
!include "FileFunc.nsh"
!include "LogicLib.nsh"
!include "Sections.nsh"

Name "${APP}"
OutFile "${OUTFILE}"
InstallDir "$LOCALAPPDATA\Programs\${APP}"
InstallDirRegKey HKCU "${UNINST_KEY}" "InstallLocation"
RequestExecutionLevel user
SetCompressor /SOLID lzma
ManifestDPIAware true
BrandingText "${APP} ${VERSION}"
VIProductVersion "${VERSION}.0"
VIAddVersionKey "ProductName" "${APP}"
VIAddVersionKey "ProductVersion" "${VERSION}"
VIAddVersionKey "FileVersion" "${VERSION}"
VIAddVersionKey "FileDescription" "${APP} installer"
VIAddVersionKey "LegalCopyright" "MIT License"

!define MUI_ICON "..\..\resources\windows\qmgui.ico"
!define MUI_UNICON "..\..\resources\windows\qmgui.ico"
!define MUI_ABORTWARNING
!define MUI_COMPONENTSPAGE_NODESC
!define MUI_FINISHPAGE_RUN "$INSTDIR\${EXE}"
!define MUI_FINISHPAGE_RUN_TEXT "Start ${APP}"

!insertmacro MUI_PAGE_COMPONENTS
!insertmacro MUI_PAGE_DIRECTORY
!insertmacro MUI_PAGE_INSTFILES
!insertmacro MUI_PAGE_FINISH
!insertmacro MUI_UNPAGE_CONFIRM
!insertmacro MUI_UNPAGE_INSTFILES
!insertmacro MUI_LANGUAGE "English"

; the program files of an older version: removed before the new ones are copied (an upgrade),
; and by the uninstaller. Only what the installer put there: INSTDIR itself may be shared.
!macro RemoveProgramFiles
  RMDir /r "$INSTDIR\_internal"
  Delete "$INSTDIR\${EXE}"
  Delete "$INSTDIR\qmgui-cli.exe"
  Delete "$INSTDIR\qmgui"
  Delete "$INSTDIR\qmgui.ico"
!macroend

Section "${APP} (required)" SecApp
  SectionIn RO
  SetOutPath "$INSTDIR"
  ; an upgrade: a running qmgui holds its files; ask to close it rather than mix versions
  ${If} ${FileExists} "$INSTDIR\${EXE}"
    retry:
    ClearErrors
    Delete "$INSTDIR\${EXE}"
    ${If} ${Errors}
      MessageBox MB_RETRYCANCEL|MB_ICONEXCLAMATION "${APP} is running. Quit it (tray icon, Quit) and retry." /SD IDCANCEL IDRETRY retry
      Abort "${APP} is running"
    ${EndIf}
  ${EndIf}
  !insertmacro RemoveProgramFiles
  File /r "${BUNDLE}\*"
  File "/oname=$INSTDIR\qmgui.ico" "..\..\resources\windows\qmgui.ico"
  WriteUninstaller "$INSTDIR\uninstall.exe"

  CreateShortCut "$SMPROGRAMS\${APP}.lnk" "$INSTDIR\${EXE}" "" "$INSTDIR\qmgui.ico" 0
  WriteRegStr HKCU "${APP_PATHS_KEY}" "" "$INSTDIR\${EXE}"  ; Win+R qmgui

  WriteRegStr HKCU "${UNINST_KEY}" "DisplayName" "${APP}"
  WriteRegStr HKCU "${UNINST_KEY}" "DisplayVersion" "${VERSION}"
  WriteRegStr HKCU "${UNINST_KEY}" "Publisher" "qmgui developers"
  WriteRegStr HKCU "${UNINST_KEY}" "DisplayIcon" "$INSTDIR\qmgui.ico"
  WriteRegStr HKCU "${UNINST_KEY}" "InstallLocation" "$INSTDIR"
  WriteRegStr HKCU "${UNINST_KEY}" "UninstallString" '"$INSTDIR\uninstall.exe"'
  WriteRegStr HKCU "${UNINST_KEY}" "QuietUninstallString" '"$INSTDIR\uninstall.exe" /S'
  WriteRegDWORD HKCU "${UNINST_KEY}" "NoModify" 1
  WriteRegDWORD HKCU "${UNINST_KEY}" "NoRepair" 1
  ${GetSize} "$INSTDIR" "/S=0K" $0 $1 $2
  WriteRegDWORD HKCU "${UNINST_KEY}" "EstimatedSize" "$0"
SectionEnd

Section "Desktop shortcut" SecDesktop
  CreateShortCut "$DESKTOP\${APP}.lnk" "$INSTDIR\${EXE}" "" "$INSTDIR\qmgui.ico" 0
SectionEnd

Section /o "Start with Windows (in the tray)" SecAutostart
  WriteRegStr HKCU "${RUN_KEY}" "${APP}" '"$INSTDIR\${EXE}" --minimized'
SectionEnd

; a choice left out this time undoes the one an older install made
Section "-undo choices"
  ${IfNot} ${SectionIsSelected} ${SecDesktop}
    Delete "$DESKTOP\${APP}.lnk"
  ${EndIf}
  ${IfNot} ${SectionIsSelected} ${SecAutostart}
    DeleteRegValue HKCU "${RUN_KEY}" "${APP}"
  ${EndIf}
SectionEnd

Function .onInit
  ; an upgrade keeps the choices of the install it replaces
  ReadRegStr $0 HKCU "${UNINST_KEY}" "InstallLocation"
  ${If} $0 != ""
    ${IfNot} ${FileExists} "$DESKTOP\${APP}.lnk"
      !insertmacro UnselectSection ${SecDesktop}
    ${EndIf}
    ReadRegStr $1 HKCU "${RUN_KEY}" "${APP}"
    ${If} $1 != ""
      !insertmacro SelectSection ${SecAutostart}
    ${EndIf}
  ${EndIf}
  ; silent installs: /DESKTOP=0|1 /AUTOSTART=0|1
  ${GetParameters} $R0
  ClearErrors
  ${GetOptions} $R0 "/DESKTOP=" $R1
  ${IfNot} ${Errors}
    ${If} $R1 == "0"
      !insertmacro UnselectSection ${SecDesktop}
    ${Else}
      !insertmacro SelectSection ${SecDesktop}
    ${EndIf}
  ${EndIf}
  ClearErrors
  ${GetOptions} $R0 "/AUTOSTART=" $R1
  ${IfNot} ${Errors}
    ${If} $R1 == "0"
      !insertmacro UnselectSection ${SecAutostart}
    ${Else}
      !insertmacro SelectSection ${SecAutostart}
    ${EndIf}
  ${EndIf}
FunctionEnd

Section "Uninstall"
  retry:
  ClearErrors
  Delete "$INSTDIR\${EXE}"
  ${If} ${Errors}
  ${AndIf} ${FileExists} "$INSTDIR\${EXE}"
    MessageBox MB_RETRYCANCEL|MB_ICONEXCLAMATION "${APP} is running. Quit it (tray icon, Quit) and retry." /SD IDCANCEL IDRETRY retry
    Abort "${APP} is running"
  ${EndIf}
  !insertmacro RemoveProgramFiles
  Delete "$INSTDIR\uninstall.exe"
  RMDir "$INSTDIR"  ; only when empty: never anything the installer did not put there
  Delete "$SMPROGRAMS\${APP}.lnk"
  Delete "$DESKTOP\${APP}.lnk"
  DeleteRegValue HKCU "${RUN_KEY}" "${APP}"
  DeleteRegKey HKCU "${APP_PATHS_KEY}"
  DeleteRegKey HKCU "${UNINST_KEY}"
  ; settings and caches (%LOCALAPPDATA%\qmgui) are the user's: kept
SectionEnd
