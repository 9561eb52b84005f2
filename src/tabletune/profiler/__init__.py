"""tabletune.profiler: T(B,k) and acceptance measured on real vLLM (docs/profiler.md)."""
