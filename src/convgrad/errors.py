"""Error hierarchy (bottom layer: imports nothing from convgrad).

Every error that convgrad raises for bad user input is a :class:`ConvError` and also a
``ValueError`` (bad value or shape) or a ``TypeError`` (bad type). Messages name the op or
function, the attribute or input at fault, what was expected and what was given:
``"conv_backward_weights: strides must be positive integers, but got (2, 0)"``.
"""

from __future__ import annotations


class ConvError(Exception):
    """Root of every error convgrad raises for bad input."""


class ConvValueError(ConvError, ValueError):
    """A bad value or shape."""


class ConvTypeError(ConvError, TypeError):
    """A bad type (element type, attribute type)."""


class WorkspaceError(ConvValueError):
    """The workspace cap is too small for the smallest tile of a problem."""


def fail(op: str, what: str, expected: str, got: object, *, kind: type = ConvValueError) -> "ConvError":
    """Build (not raise) an error in the house style: ``op: what must be expected, but got got``."""
    return kind(f"{op}: {what} must be {expected}, but got {got}")
