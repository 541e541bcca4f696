"""The one error type of :mod:`app.mechanisms`."""

from __future__ import annotations


class MechanismInputError(ValueError):
    """Invalid input to a mechanism; ``parameter`` names the offending argument.

    Messages name the parameter and the problem. They may repeat a bad *parameter* value
    (epsilon, bounds, quantiles: all chosen by the caller) but never a data value: for data
    problems only the position of the first bad element is given.
    """

    def __init__(self, parameter: str, problem: str) -> None:
        super().__init__(f"{parameter}: {problem}")
        self.parameter = parameter
        self.problem = problem
