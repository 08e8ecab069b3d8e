"""Errors of the data pipeline. Each names the file, column, value or count at fault and what to do."""

from __future__ import annotations

# The exit status of a command (`python -m training ...`) that stopped on a PipelineError: its launcher fails
# the task without retries instead of treating the exit as a crash that a retry might get past.
EXIT_PIPELINE_ERROR = 3
# The exit status of `python -m training identical` when a registered version was trained from the same
# inputs: the launching pod task is skipped (KubernetesPodOperator skip_on_exit_code), and the steps after it.
EXIT_SKIPPED = 99


class PipelineError(Exception):
    """Base class: a data problem that must stop the run, explained for a person."""


class RunParameterError(PipelineError, ValueError):
    """A run's parameter or triggering events name no usable date: retrying cannot fix it."""


class ArrivalNotFoundError(PipelineError):
    pass


class LandingFileError(PipelineError):
    """One or more landing files are unusable as a whole (columns, encoding, no rows)."""

    def __init__(self, arrival: str, problems: list[str]) -> None:
        self.problems = problems
        listing = "\n".join(f"  - {p}" for p in problems)
        super().__init__(
            f"arrival {arrival}: {len(problems)} unusable file(s); nothing was written to bronze, "
            f"quarantine or silver:\n{listing}\nFix the files in the landing zone (or have the producer "
            f"resend them), then rerun the date."
        )


class QuarantineRateError(PipelineError):
    pass


class DataValidationError(PipelineError):
    pass


class EmptyArrivalError(PipelineError):
    pass


class LockTimeoutError(Exception):
    """A shared resource (the DVC repository) stayed locked by another operation past the wait allowed.

    Not a PipelineError: nothing is wrong with the data, so the task keeps its retries and a later attempt
    can succeed once the other operation is done."""
