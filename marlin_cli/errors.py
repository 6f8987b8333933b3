"""One error hierarchy. Messages give the value, the rule and the fix; the CLI maps them to exit codes."""

from __future__ import annotations


class MarlinError(Exception):
    """Base of every error the tool reports to the user without a traceback."""

    exit_code = 2


class UsageError(MarlinError):
    """A flag value or combination that cannot work."""


class ConfigError(MarlinError):
    """A quantization setting or preset that is invalid."""


class ModelError(MarlinError):
    """A model path, config or architecture the tool cannot use."""


class ShapeError(MarlinError):
    """A tensor shape the Marlin format or kernel cannot take."""


class CheckpointError(MarlinError):
    """A checkpoint file that is missing, corrupt or inconsistent."""


class CalibrationError(MarlinError):
    """Calibration data that is missing or too short."""


class KernelUnavailable(MarlinError):
    """The CUDA kernel cannot be built or run here."""


class VerificationFailed(MarlinError):
    """At least one layer failed verification."""

    exit_code = 1


class NumericalError(MarlinError):
    """A solve that failed numerically even after the automatic retries."""
