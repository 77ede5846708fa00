"""Every error gradzip raises on purpose is a GradzipError (and a ValueError where a bad value
is the natural reading), so one ``except gradzip.GradzipError`` catches them all."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import gradzip
from gradzip.experiments.config import ConfigError
from gradzip.experiments.gradient_bits import UsageError


def _exception_classes() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(gradzip.__path__, "gradzip."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__.startswith("gradzip"):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[name] for name in sorted(found)]


# the deprecated aliases of moved modules warn when imported; their warning is tested elsewhere
@pytest.mark.filterwarnings("ignore:gradzip\\..* is deprecated:DeprecationWarning")
def test_every_gradzip_exception_is_a_gradzip_error() -> None:
    classes = _exception_classes()
    assert ConfigError in classes and UsageError in classes
    errors = [cls for cls in classes if issubclass(cls, Exception)]
    strays = [cls.__qualname__ for cls in errors if not issubclass(cls, gradzip.GradzipError)]
    assert not strays, f"exceptions outside GradzipError: {strays}"
    # the rest are interruptions (a run stopped by a signal), which must stay KeyboardInterrupts
    # so that ``except Exception`` does not swallow a Ctrl-C
    others = [cls for cls in classes if cls not in errors]
    assert all(issubclass(cls, KeyboardInterrupt) for cls in others), others


@pytest.mark.parametrize("cls", [ConfigError, UsageError, gradzip.CheckpointError])
def test_user_value_errors_stay_value_errors(cls: type[Exception]) -> None:
    assert issubclass(cls, gradzip.GradzipError) and issubclass(cls, ValueError)
