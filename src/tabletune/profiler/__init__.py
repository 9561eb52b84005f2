"""tabletune.profiler (see DESIGN.md)."""
