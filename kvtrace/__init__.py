"""kvtrace: anonymized Mooncake-format prefix-caching traces from LLM request logs.

One import name: the stages (`kvtrace.transforms`) and the jobs (`kvtrace.pipelines`) live in the
checkout's top-level folders transforms/ and pipelines/. The wheel installs them inside this
package (pyproject's package-dir); in a checkout, or a copy of the source tree as the worker image
lays it out, they are adopted here from beside this folder. Either way a module has one name, so
nothing kvtrace installs claims the common top-level names `transforms` or `pipelines`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

_SUBPACKAGES = ("transforms", "pipelines")


def _adopt_from_checkout(name: str) -> None:
    here = Path(__file__).parent
    if (here / name).is_dir():  # installed from the wheel: an ordinary subpackage
        return
    init = here.parent / name / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        f"{__name__}.{name}", init, submodule_search_locations=[str(init.parent)]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"kvtrace's {name}/ folder is missing beside {here}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    globals()[name] = module


for _name in _SUBPACKAGES:
    if f"{__name__}.{_name}" not in sys.modules:
        _adopt_from_checkout(_name)


def __getattr__(name: str) -> Any:
    # The version is read on demand: importing any kvtrace module must not load the writers.
    if name == "__version__":
        from kvtrace.transforms.write.manifest import KVTRACE_VERSION

        return KVTRACE_VERSION
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
