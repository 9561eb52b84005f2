"""The vLLM plugin (docs/plugin.md): three entry points over pure logic.

Glue (imports vLLM lazily): ``engine`` (general plugin: compat fix + EngineCore utilities),
``http`` (endpoint plugin), ``metrics`` (stat-logger plugin). Pure: ``policy`` (per-step k),
``controller`` (engine-side state), ``wire`` (cross-process envelopes), ``engine_backend``
(HTTP side's backend), ``metrics_core`` (Prometheus families), ``compat`` (the 0.26.0 fix).
"""
