"""Named errors raised at the edges of the pipeline. Each message says what to fix."""

from __future__ import annotations

from infra.pii import redact_text


class IndusflowError(Exception):
    """Base class of the project's own errors."""


class DataValidationError(IndusflowError, ValueError):
    """Input data does not satisfy its schema.

    Its message (the source, the column, the text) passes the personal-data redactor: it is
    printed, logged and kept in run states, and a file name or a cell may hold a phone number.

    Attributes:
        source: the file (or table name) that failed.
        column: the offending column, if one.
        rows: the first offending row numbers (0-based, in file order), if any.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        column: str | None = None,
        rows: list[int] | None = None,
    ) -> None:
        self.source = source
        self.column = column
        self.rows = list(rows or [])
        parts = []
        if source:
            parts.append(f"{source}")
        if column:
            parts.append(f"column {column!r}")
        prefix = ": ".join([", ".join(parts)]) if parts else ""
        text = f"{prefix}: {message}" if prefix else message
        if self.rows:
            text += f" (first offending rows: {self.rows})"
        super().__init__(redact_text(text))


class QualityGateError(IndusflowError):
    """A candidate model did not pass the promotion gate and strict mode was asked for."""


class RegistryError(IndusflowError):
    """The model registry is missing a model or version, or is inconsistent."""


class PathEscapeError(IndusflowError, ValueError):
    """A user-given relative path would leave the folder it must stay in."""


class ReproductionError(IndusflowError):
    """A registered version cannot be reproduced here: its data or a major package version changed."""


class InfrastructureError(IndusflowError):
    """The job cannot do its work here (no model, a missing setting, an unreachable share).

    Not the input's fault: batch jobs leave the file for the next run instead of quarantining it.
    """


class ApprovalError(IndusflowError):
    """An approval of a champion move that cannot be given: no such waiting run, the same person
    who started the run (four eyes), or a run whose Prefect API is gone.

    ``code`` says which: ``unknown`` (no such run), ``invalid`` (the input), ``four_eyes``,
    ``decided`` (already decided, or not paused any more), ``gone`` (its API does not answer),
    ``no_flow`` (approval asked outside a flow run).
    """

    def __init__(self, message: str, code: str = "invalid") -> None:
        super().__init__(message)
        self.code = code
