"""The admin API shared by the vLLM plugin and the engine emulator: one implementation of the
wire models, the table/settings state transitions, and the HTTP routes."""
