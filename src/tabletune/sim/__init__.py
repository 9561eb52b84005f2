"""tabletune.sim: the engine emulator, a vLLM-0.26-with-plugin look-alike (docs/sim.md).

- ``scenario``: scenario files (engine, load, acceptance, faults), validated on load.
- ``processes``: load B(t) and acceptance a(t) as piecewise-constant functions of time.
- ``engine``: ``EngineSim``, the pure decode loop in simulated time (no HTTP, no wall clock).
- ``build``: scenario + profile -> ``EngineSim`` and the plugin's engine side over it.
- ``metrics``: the ``/metrics`` families, read from an engine at scrape time.
- ``faults``, ``replica``: faults, wall-clock mapping and the admin backend of one engine.
- ``app``, ``serve``, ``cli``: the HTTP routes, one-port-per-engine serving, ``tabletune sim``.
"""
