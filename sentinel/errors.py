"""The project's small error hierarchy.

User-facing failures (bad scenarios, bad flags, unknown plugins) raise a subclass of `SentinelError`;
the CLI turns them into one-line messages and exit code 2. `assert` is kept for internal invariants.
"""

from __future__ import annotations


class SentinelError(Exception):
    """Base class for every error the testbed raises on purpose."""


class ConfigError(SentinelError):
    """One or more located problems in a scenario, a plugin config or a CLI override.

    Each problem reads `path: message`, e.g.
    `adversary.attacks[1].scale: unknown key 'scael' (did you mean 'scale'?)`.
    """

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class UnknownPluginError(ConfigError):
    """A registry lookup for a name that is not registered."""


class RunError(SentinelError):
    """A run that failed for a reason other than bad input (exit code 1)."""
