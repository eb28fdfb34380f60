"""How a config's problems are reported: a list of (field path, message), each path relative to the
config's root (``trainer.lr``; ``""`` for the config as a whole).

Where a config sits inside a larger document (a job spec's ``config``, an API body's ``config`` or
``config_overrides``, an import's ``yaml``), its paths are put under that document's key by
:func:`joined` and taken back out by :func:`relative`: the one place a path prefix is added or removed.
"""

from __future__ import annotations


def joined(prefix: str, path: str) -> str:
    """``path`` inside ``prefix``: ("config", "trainer.lr") -> "config.trainer.lr", ("config", "") ->
    "config", ("", "trainer.lr") -> "trainer.lr", ("events[2]", "[0]") -> "events[2][0]"."""
    if not prefix or not path:
        return prefix or path
    return f"{prefix}{path}" if path.startswith("[") else f"{prefix}.{path}"


def relative(prefix: str, path: str) -> str | None:
    """The inverse of :func:`joined`: ``path`` relative to ``prefix``, or None when it is not inside it
    (("config", "config.trainer.lr") -> "trainer.lr", ("config", "config") -> "",
    ("config", "placement.x") -> None)."""
    if not prefix:
        return path
    if path == prefix:
        return ""
    if path.startswith(f"{prefix}."):
        return path[len(prefix) + 1 :]
    if path.startswith(f"{prefix}["):
        return path[len(prefix) :]
    return None


class FieldError(ValueError):
    """A cross-field check whose fix is one field's: reported at ``path`` (relative to the model that
    raised it), so an HTTP 400 and the web form show it next to that field."""

    def __init__(self, path: str, message: str):
        self.path = path
        super().__init__(message)


class ConfigError(ValueError):
    """A config problem, phrased for one line of CLI output or one field of an HTTP 400: ``errors`` are
    (field path, message) pairs."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{loc}: {msg}" if loc else msg for loc, msg in errors))

    def under(self, prefix: str) -> ConfigError:
        """The same problems, their paths inside a document that holds the config at ``prefix``."""
        return ConfigError([(joined(prefix, path), msg) for path, msg in self.errors])

    def by_path(self) -> dict[str, list[str]]:
        """{path: [messages]}, in the order the problems came (an HTTP 400's field errors)."""
        out: dict[str, list[str]] = {}
        for path, msg in self.errors:
            out.setdefault(path, []).append(msg)
        return out
