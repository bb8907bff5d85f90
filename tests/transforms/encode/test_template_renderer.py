"""transformers' renderer loaded alone renders as the one transformers' own import gives, leaves
no trace in sys.modules, and a later real `import transformers` works; its faster plain-data
copy gives what transformers' own gives, for any value."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.encode import template_renderer

SHARED_TEMPLATES = Path(__file__).resolve().parents[3].parent / "shared" / "templates"
# Loops, a namespace, tojson of tools and arguments, whitespace control: what real templates use.
TEMPLATE = (
    "{%- set ns = namespace(n=0) %}{%- if tools %}{{ tools | tojson(indent=2) }}\n{% endif %}"
    "{%- for m in messages %}{%- set ns.n = ns.n + 1 %}<|{{ m.role }}|>{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}[{{ c.function.name }} {{ c.function.arguments | tojson }}]"
    "{%- endfor %}\n{% endfor %}{%- if add_generation_prompt %}<|assistant|>{{ ns.n }}{% endif %}"
)
CHAT = [
    {"role": "system", "content": "Sé breve."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": {"q": "ü", "n": [1.5]}}}
        ],
    },
    {"role": "user", "content": "  spaces \n"},
]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]

# Renders every template with the renderer loaded alone, then with transformers imported for
# real, and prints both (a template's error as its type) with what sys.modules held in between.
SCRIPT = """
import json, sys
from kvtrace.transforms.encode import template_renderer
templates, chat, tools = json.loads(open(sys.argv[1]).read())

def texts(render):
    out = []
    for template in templates:
        try:
            out.append(render([chat], tools=tools, chat_template=template,
                              add_generation_prompt=True)[0][0])
        except Exception as err:
            out.append("!" + type(err).__name__)
    return out

# strftime_now (gpt-oss prints it) reads the request's time in ours, a stopped clock in theirs
from kvtrace.transforms.encode.template_names import render_at
alone = render_at(1_700_000_000_000, lambda: texts(template_renderer.render_jinja_template()))
left = sorted(m for m in sys.modules if m.split(".")[0] == "transformers"
              or m.startswith("huggingface_hub.hf_api"))
import datetime
import transformers
from transformers.utils import chat_template_utils
from transformers.utils.chat_template_utils import render_jinja_template
class Stopped(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=tz)
chat_template_utils.datetime = Stopped
print(json.dumps({"alone": alone, "real": texts(render_jinja_template), "left": left,
                  "full_package": hasattr(transformers, "PreTrainedTokenizerFast")}))
"""


def _templates() -> list[str]:
    shipped = sorted(SHARED_TEMPLATES.glob("*.jinja")) if SHARED_TEMPLATES.is_dir() else []
    return [TEMPLATE] + [path.read_text(encoding="utf-8") for path in shipped]


def test_loaded_alone_it_renders_as_transformers_does_and_leaves_nothing_behind(tmp_path):
    (tmp_path / "inputs.json").write_text(json.dumps([_templates(), CHAT, TOOLS]))
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "inputs.json")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout)
    assert found["alone"] == found["real"]
    assert found["alone"][0].endswith("<|assistant|>3")
    assert sum(not text.startswith("!") for text in found["alone"]) > len(found["alone"]) // 2
    assert found["left"] == []  # no transformers module, and the hub client never imported
    assert found["full_package"]


def test_with_transformers_already_imported_a_bounded_copy_is_used_and_the_shared_one_left():
    code = (
        "import transformers.utils.chat_template_utils as real\n"
        "from kvtrace.transforms.encode import template_renderer\n"
        "render = template_renderer.render_jinja_template()\n"
        "print(render is real.render_jinja_template, real.ImmutableSandboxedEnvironment.__name__,"
        " render.__globals__['ImmutableSandboxedEnvironment'].__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "ImmutableSandboxedEnvironment", "BoundedSandbox"]


class Colour(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


class Name(str):
    pass


@dataclasses.dataclass
class Point:
    x: int
    label: str


SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(2**63, 2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
)
ODD = (
    st.builds(Name, st.text(max_size=4))
    | st.just(Colour.RED)
    | st.just(Level.HIGH)
    | st.builds(np.int64, st.integers(-5, 5))
    | st.just(np.bool_(False))
    | st.builds(Point, st.integers(), st.text(max_size=3))
    | st.just(datetime.date(2026, 11, 25))
    | st.just(b"raw")
)
KEYS = st.text(max_size=4) | st.integers() | st.builds(Name, st.text(max_size=3)) | st.none()
VALUES = st.recursive(
    SCALARS | ODD,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(KEYS, inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
    ),
    max_leaves=25,
)


def _shape(value):
    """Type and value, recursively and in order (NaN compares equal to NaN here)."""
    if isinstance(value, dict):
        return ("dict", type(value).__name__, [(_shape(k), _shape(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_shape(item) for item in value])
    return (type(value).__name__, repr(value))


@settings(max_examples=300, deadline=None)
@given(value=VALUES)
def test_the_plain_copy_is_what_transformers_gives_for_any_value(value):
    from transformers.utils.chat_template_utils import _plain_template_data

    copied = template_renderer._copy_plain(value, _plain_template_data)
    assert _shape(copied) == _shape(_plain_template_data(value))
    if isinstance(value, (dict, list)):
        assert copied is not value  # transformers edits the copy it gets
