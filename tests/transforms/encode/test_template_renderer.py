"""transformers' renderer loaded alone renders as the one transformers' own import gives, leaves
no trace in sys.modules, and a later real `import transformers` works."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SHARED_TEMPLATES = Path(__file__).resolve().parents[3].parent / "shared" / "templates"
# Loops, a namespace, tojson of tools and arguments, whitespace control: what real templates use.
TEMPLATE = (
    "{%- set ns = namespace(n=0) %}{%- if tools %}{{ tools | tojson(indent=2) }}\n{% endif %}"
    "{%- for m in messages %}{%- set ns.n = ns.n + 1 %}<|{{ m.role }}|>{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}[{{ c.function.name }} {{ c.function.arguments | tojson }}]"
    "{%- endfor %}\n{% endfor %}{%- if add_generation_prompt %}<|assistant|>{{ ns.n }}{% endif %}"
)
CHAT = [{"role": "system", "content": "Sé breve."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": {"q": "ü", "n": [1.5]}}}]},
        {"role": "user", "content": "  spaces \n"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]

# Renders every template with the renderer loaded alone, then with transformers imported for
# real, and prints both (a template's error as its type) with what sys.modules held in between.
SCRIPT = """
import json, sys
from transforms.encode import template_renderer
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

alone = texts(template_renderer.render_jinja_template())
left = sorted(m for m in sys.modules if m.split(".")[0] == "transformers"
              or m.startswith("huggingface_hub.hf_api"))
import transformers
from transformers.utils.chat_template_utils import render_jinja_template
print(json.dumps({"alone": alone, "real": texts(render_jinja_template), "left": left,
                  "full_package": hasattr(transformers, "PreTrainedTokenizerFast")}))
"""


def _templates() -> list[str]:
    shipped = sorted(SHARED_TEMPLATES.glob("*.jinja")) if SHARED_TEMPLATES.is_dir() else []
    return [TEMPLATE] + [path.read_text(encoding="utf-8") for path in shipped]


def test_loaded_alone_it_renders_as_transformers_does_and_leaves_nothing_behind(tmp_path):
    (tmp_path / "inputs.json").write_text(json.dumps([_templates(), CHAT, TOOLS]))
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "inputs.json")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout)
    assert found["alone"] == found["real"]
    assert found["alone"][0].endswith("<|assistant|>3")
    assert sum(not text.startswith("!") for text in found["alone"]) > len(found["alone"]) // 2
    assert found["left"] == []  # no transformers module, and the hub client never imported
    assert found["full_package"]


def test_with_transformers_already_imported_its_own_module_is_used():
    code = ("import transformers.utils.chat_template_utils as real\n"
            "from transforms.encode import template_renderer\n"
            "print(template_renderer.render_jinja_template() is real.render_jinja_template)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
