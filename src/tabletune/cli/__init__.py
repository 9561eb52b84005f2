"""The ``tabletune`` command line."""
