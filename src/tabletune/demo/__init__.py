"""tabletune.demo: ``tabletune demo``, the whole loop on one machine (extra ``[demo]``).

- ``emulator``: a ``tabletune sim serve`` subprocess on a free port (also used by tests).
- ``truth``: what the emulator's ground truth says each cycle, and the summary (pure).
- ``view``: the live terminal view, or one line per cycle when output is piped.
- ``plot``: the PNG.
- ``cli``: ``tabletune demo``: profile and scenario, the daemon's loop, the outputs.

The daemon itself needs none of this (no terminal or plotting library): see docs/design.md.
"""
