#!/usr/bin/env python3
# Produces expected.json: reference renders of the chat templates in this folder and of small Jinja
# feature snippets, made with Python Jinja2 configured the way transformers' apply_chat_template does
# (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, json.dumps-based tojson,
# raise_exception, tool-call arguments decoded from JSON strings as vLLM does).
# Run: /usr/bin/python3 gen_expected.py   (needs python3-jinja2)
import json
import os
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.ext import loopcontrols
from jinja2.exceptions import TemplateError

HERE = os.path.dirname(os.path.abspath(__file__))


class RaisedError(Exception):
    pass


def make_env():
    def raise_exception(message):
        raise RaisedError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def decode_args(messages):
    out = json.loads(json.dumps(messages))
    for m in out:
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function", tc)
            if isinstance(fn.get("arguments"), str):
                try:
                    parsed = json.loads(fn["arguments"])
                    if isinstance(parsed, dict):
                        fn["arguments"] = parsed
                except ValueError:
                    pass
    return out


def render_chat(template_file, messages, tools=None, add_generation_prompt=True, kwargs=None, bos="", eos=""):
    src = open(os.path.join(HERE, template_file)).read()
    ctx = {"bos_token": bos, "eos_token": eos}
    ctx.update(kwargs or {})
    ctx["messages"] = decode_args(messages)
    ctx["tools"] = tools
    ctx["add_generation_prompt"] = add_generation_prompt
    try:
        return {"expected": make_env().from_string(src).render(**ctx)}
    except (RaisedError, TemplateError) as e:
        return {"error": str(e)}


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city (météo).",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string"}, "days": {"type": "integer"}}, "required": ["location"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Web search",
    "parameters": {"type": "object", "properties": {
        "queries": {"type": "array", "items": {"type": "string"}},
        "filters": {"type": "object", "properties": {"lang": {"type": "string"}}}}}}}
TOOLS = [WEATHER, SEARCH]

TOOL_CALL_TURN = [
    {"role": "system", "content": "You are a travel agent."},
    {"role": "user", "content": "Weather in Paris and Louvre hours?"},
    {"role": "assistant", "content": "I'll check both.\n", "reasoning_content": "Two tools needed.",
     "tool_calls": [
         {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                            "arguments": "{\"location\": \"Paris\", \"days\": 3, \"metric\": true, \"note\": null}"}},
         {"id": "call_2", "type": "function", "function": {"name": "search",
                                                            "arguments": {"queries": ["louvre hours", "metro map"], "filters": {"lang": "fr", "safe": False}, "limit": 2.5}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "Open 9-18"}]},
]

M3_CASES = {
    "m3_plain_user": dict(messages=[{"role": "user", "content": "Hello!"}]),
    "m3_system_user_enabled": dict(messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
                                   kwargs={"thinking_mode": "enabled"}),
    "m3_disabled": dict(messages=[{"role": "user", "content": "Hi"}], kwargs={"thinking_mode": "disabled"}),
    "m3_adaptive": dict(messages=[{"role": "user", "content": "Hi"}], kwargs={"thinking_mode": "adaptive"}),
    "m3_no_generation_prompt": dict(messages=[{"role": "user", "content": "Hi"}], add_generation_prompt=False),
    "m3_multi_turn_reasoning": dict(messages=[
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4.", "reasoning_content": "Trivial sum."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "<mm:think>\nAdd them.\n</mm:think>\n6."},
        {"role": "user", "content": "Thanks"},
        {"role": "assistant", "content": "You're welcome."},
        {"role": "user", "content": "Bye"}], kwargs={"thinking_mode": "enabled"}),
    "m3_tools_history": dict(messages=TOOL_CALL_TURN, tools=TOOLS, kwargs={"thinking_mode": "adaptive"}),
    "m3_tools_only_declared": dict(messages=[{"role": "user", "content": "Weather?"}], tools=TOOLS),
    "m3_root_developer_parts": dict(messages=[
        {"role": "root", "content": "Custom identity."},
        {"role": "developer", "content": [{"type": "text", "text": "Dev rules."}]},
        {"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "image"}, {"type": "text", "text": " ok?"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"location": "Oslo"}}}]},
        {"role": "tool", "content": "cold"}], tools=[WEATHER], kwargs={"thinking_mode": "disabled"}),
    "m3_tool_without_call": dict(messages=[{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]),
}

OTHER_CASES = {
    "mistral_alternating": ("mistral_like.jinja", dict(messages=[
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}],
        bos="<s>", eos="</s>")),
    "mistral_bad_roles": ("mistral_like.jinja", dict(messages=[{"role": "assistant", "content": "Hi"}], bos="<s>", eos="</s>")),
    "llama3_plain": ("llama3_like.jinja", dict(messages=[{"role": "system", "content": "  Be nice.  "}, {"role": "user", "content": "Hi  "}],
                                               bos="<|begin_of_text|>")),
    "llama3_tools": ("llama3_like.jinja", dict(messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{\"location\": \"Paris\"}"}}]},
        {"role": "tool", "content": "sunny"}], tools=TOOLS, bos="<|begin_of_text|>", kwargs={"date_string": "01 Jan 2026"})),
    "qwen3_tools": ("qwen3_like.jinja", dict(messages=TOOL_CALL_TURN + [{"role": "assistant", "content": "<think>\nDone.\n</think>\n\nSunny, 9-18."}], tools=TOOLS)),
    "qwen3_plain_nothink": ("qwen3_like.jinja", dict(messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
                                                     kwargs={"enable_thinking": False})),
}

# Feature snippets: (template, context). Each exercises a Jinja feature against Python Jinja2.
SNIPPETS = [
    ("{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ 7 / 2 }}|{{ 1.5 + 1 }}", {}),
    ("{{ 'a' ~ 1 ~ none ~ true }}|{{ 'ab' * 3 }}|{{ [1] + [2, 3] }}|{{ 'x' + 'y' }}", {}),
    ("{{ 1 < 2 and 2 <= 2 and 3 > 1 and 3 >= 3 and 1 != 2 and 1 == 1.0 }}|{{ not 1 }}|{{ 0 or 'z' }}|{{ '' and 'q' }}", {}),
    ("{{ 'b' in 'abc' }}|{{ 'd' not in 'abc' }}|{{ 2 in [1, 2] }}|{{ 'k' in d }}|{{ 'z' not in d }}", {"d": {"k": 1}}),
    ("{{ xs[1:] }}|{{ xs[:2] }}|{{ xs[-1] }}|{{ xs[::-1] }}|{{ xs[1:-1] }}|{{ s[1:3] }}|{{ s[::-1] }}|{{ s[-2:] }}", {"xs": [1, 2, 3, 4], "s": "héllo"}),
    ("{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.length }}/{{ loop.first }}/{{ loop.last }};{% endfor %}", {"xs": ["a", "b", "c"]}),
    ("{% for x in xs if x is odd %}{{ x }}{{ ',' if not loop.last }}{% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}", {"xs": [1, 2, 3, 4, 5]}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for k in d %}{{ k }}{% endfor %}", {"d": {"z": 1, "a": [1, 2], "m": None}}),
    ("{% for x in xs %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}", {"xs": [1, 2, 3, 4]}),
    ("{% set ns = namespace(total=0, seen=[]) %}{% for x in xs %}{% set ns.total = ns.total + x %}{% endfor %}{{ ns.total }}", {"xs": [1, 2, 3]}),
    ("{% set a = 1 %}{% for x in xs %}{% set a = x %}{% endfor %}{{ a }}|{% if true %}{% set b = 2 %}{% endif %}{{ b }}", {"xs": [5, 6]}),
    ("{% set block %}Hi {{ name }}!{% endset %}[{{ block }}]|{% set u | upper %}shout{% endset %}{{ u }}", {"name": "Bob"}),
    ("{% macro greet(name, punct='!') %}Hello {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(name='C', punct='.') }}", {}),
    ("{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1) | int }}{% endif %}{% endmacro %}{{ fact(5) }}", {}),
    ("{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}inner{% endcall %}", {}),
    ("{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(sort_keys=true) }}|{{ 'é\"\\n\u2028' | tojson }}|{{ 'é😀' | tojson(ensure_ascii=true) }}",
     {"d": {"b": [1, 2.5, None, True], "a": {"x": "y"}, "e": [], "f": {}, "g": 1e20, "h": 0.0001, "i": 1e-05}}),
    ("{{ x | string }}|{{ none | string }}|{{ [1, 'a', none, true] | string }}|{{ {'a': 1} }}|{{ 3.0 }}|{{ 1e16 }}|{{ 123456789.0 }}|{{ \"it's\" | string }}|{{ [\"it's\"] }}", {"x": 1.25}),
    ("{{ '  hi  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ 'abc' | length }}|{{ xs | length }}|{{ xs | join(', ') }}|{{ 'Hi' | upper }}{{ 'Hi' | lower }}|{{ 'a-b-c' | replace('-', '+') }}", {"xs": [1, 2, 3]}),
    ("{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a,b,c'.split(',', 1) }}|{{ '\\n x \\n'.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'xxa'.lstrip('x') }}|{{ 'axx'.rstrip('x') }}", {}),
    ("{{ 'hello'.startswith('he') }}|{{ 'hello'.endswith('lo') }}|{{ 'hello'.startswith(('x', 'h')) }}|{{ 'hello world'.title() }}|{{ 'abc'.upper() }}|{{ 'a b'.replace(' ', '_') }}", {}),
    ("{{ d.get('a') }}|{{ d.get('zz') }}|{{ d.get('zz', 5) }}|{{ d.keys() | list }}|{{ d.values() | list }}|{{ d['a'] }}|{{ d.a }}", {"d": {"a": 1, "b": 2}}),
    ("{{ x is defined }}|{{ y is undefined }}|{{ none is none }}|{{ true is boolean }}|{{ 1 is number }}|{{ 1.5 is float }}|{{ 1 is integer }}|{{ 's' is string }}|{{ d is mapping }}|{{ xs is iterable }}|{{ 's' is iterable }}|{{ xs is sequence }}|{{ 3 is odd }}|{{ 4 is even }}|{{ 9 is divisibleby 3 }}|{{ 1 is not string }}|{{ true is number }}|{{ y is iterable }}",
     {"x": 1, "d": {}, "xs": [1]}),
    ("{{ xs | first }}|{{ xs | last }}|{{ xs | reverse | list }}|{{ xs | sort }}|{{ xs | unique | list }}|{{ xs | min }}|{{ xs | max }}|{{ xs | sum }}|{{ xs | map('string') | join('-') }}", {"xs": [3, 1, 2, 3]}),
    ("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }}|{{ ms | rejectattr('role', 'equalto', 'user') | list | length }}|{{ [0, 1, '', 'a'] | select | list }}",
     {"ms": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}, {"role": "user", "content": "c"}]}),
    ("{{ undefined_thing | default('dflt') }}|{{ '' | default('e', true) }}|{{ '42' | int + 1 }}|{{ '2.5' | float }}|{{ -3 | abs }}|{{ 2.567 | round(2) }}|{{ 'x' if false else 'y' }}|{{ 'x' if false }}|{{ 'abc' | capitalize }}", {}),
    ("{{ range(3) | list }}|{{ range(1, 7, 2) | list }}|{{ dict(a=1, b='x') | tojson }}|{{ '%s-%d' | format('a', 3) }}|{{ 'v=%s' % 5 }}|{{ 'a{}c'.format('b') }}", {}),
    ("{% for k, v in d | dictsort %}{{ k }}{{ v }}{% endfor %}|{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %}|{{ 'a\\nb' | indent(2) }}|{{ 'one two' | wordcount }}", {"d": {"b": 1, "a": 2}}),
    ("line1\n  {% if true %}\n  yes\n  {% endif %}\n{# comment #}\nafter   {{- ' trimmed' }}\n{%- if true %} x {% endif -%}\n end\n", {}),
    ("{% raw %}{{ not evaluated }}{% endraw %}|{{ 'a' 'b' }}|{{ \"q\\\"q\" }}|{{ (1, 2) | list }}|{{ {'k': [1, {'n': none}]} | tojson }}", {}),
    ("{%- for m in ms -%}{{ m.role }}{%- if not loop.last %},{% endif -%}{%- endfor %}\n", {"ms": [{"role": "a"}, {"role": "b"}]}),
    ("{{ a.b }}", {"a": {"c": 1}}),
    ("{{ a.b.c }}", {}),
    ("{% if x %}unterminated", {}),
    ("{{ raise_exception('boom at ' ~ 3) }}", {}),
    ("{{ 1 + }}", {}),
]


def main():
    out = {"chat": [], "snippets": []}
    for name, case in M3_CASES.items():
        r = render_chat("MiniMax-M3.jinja", **case)
        out["chat"].append({"name": name, "template": "MiniMax-M3.jinja",
                            "messages": case["messages"], "tools": case.get("tools"),
                            "add_generation_prompt": case.get("add_generation_prompt", True),
                            "kwargs": case.get("kwargs", {}), "bos": "", "eos": "", **r})
    for name, (tmpl, case) in OTHER_CASES.items():
        r = render_chat(tmpl, **case)
        out["chat"].append({"name": name, "template": tmpl, "messages": case["messages"], "tools": case.get("tools"),
                            "add_generation_prompt": case.get("add_generation_prompt", True),
                            "kwargs": case.get("kwargs", {}), "bos": case.get("bos", ""), "eos": case.get("eos", ""), **r})
    env = make_env()
    for src, ctx in SNIPPETS:
        try:
            r = {"expected": env.from_string(src).render(**ctx)}
        except (RaisedError, TemplateError, Exception) as e:
            r = {"error": str(e)}
        out["snippets"].append({"template": src, "context": ctx, **r})
    with open(os.path.join(HERE, "expected.json"), "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
