"""What the window and the command line both do: resolve a model's engine and build, apply its
saved profile, emit its command, check backend entries. Side effects only through `engines` and
`settings`; no Qt, no argparse (`qmgui/ui` and `qmgui/cli` both import from here, never from
each other)."""
