"""User-facing recipes built on ms_boost (ms_boost itself never imports this package)."""
