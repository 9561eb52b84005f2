"""tabletune.plugin (see DESIGN.md)."""
