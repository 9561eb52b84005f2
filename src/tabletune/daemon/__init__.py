"""tabletune.daemon: the controller loop (docs/daemon.md; the whole design: docs/design.md)."""
