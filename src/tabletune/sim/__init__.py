"""tabletune.sim (see DESIGN.md)."""
