"""`ConfigError`, in a module of its own: `config` (which builds configurations) and `validate`
(which checks the values they are built from) both raise it, and neither imports the other."""
from __future__ import annotations


class ConfigError(ValueError):
    """A model configuration we cannot run, with the reason."""
