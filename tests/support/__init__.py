"""Test helpers shared by the unit and integration suites (real servers, free ports)."""
