"""The one error type a user ever sees: a bad input, reported as one line."""

__all__ = ["InputError"]


class InputError(ValueError):
    """A user mistake: names the file, the field and the fix.

    The CLI prints ``str(error)`` on one line and exits with code 2.
    """

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None):
        self.source = source
        self.field = field
        self.detail = message
        parts = []
        if source:
            parts.append(str(source))
        if field:
            parts.append(f"field '{field}'")
        prefix = ": ".join(parts)
        super().__init__(f"{prefix}: {message}" if prefix else message)

    def located(self, *, source: str | None = None, field_prefix: str | None = None) -> "InputError":
        """The same error with the file (and an outer field path) filled in."""
        field = self.field
        if field_prefix:
            field = f"{field_prefix}.{field}" if field else field_prefix
        return InputError(self.detail, source=self.source or source, field=field)
