"""Packaged emulator scenarios (``tabletune sim list``); they run on the sample profile here,
a copy of ``examples/sample-profile.json`` (a test keeps the two identical)."""
