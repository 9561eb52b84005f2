"""tabletune.daemon (see DESIGN.md)."""
