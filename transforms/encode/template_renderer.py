"""transformers' chat-template renderer, loaded without the rest of transformers.

Any `import transformers.x` first runs transformers' own `__init__`, which indexes every model
(~550 files read) and imports the hub client, and `transformers.utils`' `__init__` imports the
hub client too: 1.1 s of a chat job's ~2.3 s start-up here, paid before the first request
renders and again by every clean worker. The renderer module needs neither: its imports are
transformers' logging and import checks. So while it loads, those two packages are entered in
`sys.modules` as empty packages (found by the import system, their `__init__` not run), and
every `transformers` module loaded meanwhile is removed afterwards: the renderer keeps working
(its own imports are real modules it holds), and any later `import transformers` runs the real
package from scratch. Where transformers is already imported, or its layout ever refuses this,
the plain import is used. tests/transforms/encode/test_template_renderer.py checks both give
the same text.

The module loaded alone is this process's own, so one of its helpers is replaced there:
`_plain_template_data`, which rebuilds every message and tool out of plain JSON types before
each render (the sandbox's defence against rich objects), a call per node: 12% of a chat log's
CPU. `_copy_plain` gives the same value for every input (a property test checks it): exact JSON
types are copied here, anything else is handed to transformers' own function. And the sandbox it
compiles templates in is bounded_sandbox.BoundedSandbox, which sizes every value a template
builds before building it. Where transformers is already imported, the renderer is run again
from its file as a module of kvtrace's own (outside sys.modules), bounded the same way: the
shared module is left as it is, and a template is bounded whoever imported transformers first.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import threading
from typing import Any, Callable

RENDERER_MODULE = "transformers.utils.chat_template_utils"
PLAIN_DATA_FUNCTION = "_plain_template_data"
SANDBOX_CLASS = "ImmutableSandboxedEnvironment"  # the name the renderer builds its sandbox by
# Exactly these types transformers returns as they are.
_SCALARS = frozenset((str, int, float, bool, type(None)))
# Parents of the renderer module whose __init__ it does not need, outermost first.
UNRUN_PACKAGES = ("transformers", "transformers.utils")

_lock = threading.Lock()  # Beam may set up DoFns on several threads at once
_render: Callable[..., Any] | None = None


def render_jinja_template() -> Callable[..., Any]:
    """transformers' `render_jinja_template`, imported once per process."""
    global _render
    with _lock:
        if _render is None:
            # transformers imported already (by the caller, or a library): a copy of the
            # renderer of our own, so that bounding it leaves the shared one as it is
            module = _own_copy() if "transformers" in sys.modules else _import_alone()
            _speed_up_plain_data(module)
            _bound_sandbox(module)
            _render = module.render_jinja_template
        return _render


def _plain_import() -> Any:
    return importlib.import_module(RENDERER_MODULE)


def _own_copy() -> Any:
    """The renderer module run again from its file, outside sys.modules: its imports are the
    transformers modules already loaded, its names (the sandbox among them) its own."""
    spec = importlib.util.find_spec(RENDERER_MODULE)
    if spec is None or spec.loader is None:
        return _plain_import()
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _import_alone() -> Any:
    before = set(sys.modules)
    try:
        for name in UNRUN_PACKAGES:
            spec = importlib.util.find_spec(name)  # a dotted name's parent is the entry above
            if spec is None or spec.submodule_search_locations is None:
                raise ImportError(f"{name} is not a package")
            sys.modules[name] = importlib.util.module_from_spec(spec)
        module = importlib.import_module(RENDERER_MODULE)
    except Exception:  # a transformers laid out otherwise: nothing is lost but the time
        module = None
    finally:
        for name in set(sys.modules) - before:
            if name == "transformers" or name.startswith("transformers."):
                del sys.modules[name]
    return module if module is not None else _plain_import()


def _speed_up_plain_data(module: Any) -> None:
    original = getattr(module, PLAIN_DATA_FUNCTION, None)
    if callable(original):
        setattr(module, PLAIN_DATA_FUNCTION, functools.partial(_copy_plain, original=original))


def _bound_sandbox(module: Any) -> None:
    if hasattr(module, SANDBOX_CLASS):
        from kvtrace.transforms.encode.bounded_sandbox import BoundedSandbox

        setattr(module, SANDBOX_CLASS, BoundedSandbox)


def _copy_plain(value: Any, original: Callable[[Any], Any]) -> Any:
    """What `original` (transformers' _plain_template_data) returns for value: exact dicts,
    lists and JSON scalars copied here without a call per scalar, the rest by `original`,
    whose own recursion comes back here through the module's name."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:
        return {
            key if type(key) in _SCALARS else _copy_plain(key, original): item
            if type(item) in _SCALARS
            else _copy_plain(item, original)
            for key, item in value.items()
        }
    if kind is list:
        return [item if type(item) in _SCALARS else _copy_plain(item, original) for item in value]
    return original(value)
