#!/usr/bin/env python3
# Renders the chat-template fixtures with Python jinja2 configured as transformers does, writing cases.json.
"""Expected outputs for strata's chat-template interpreter (tests/core/test_chat_template.cpp).

The Jinja environment is the one transformers builds in
transformers/utils/chat_template_utils.py (_compile_jinja_template):

    ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                  extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    filters["tojson"] = json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
    globals["raise_exception"] = raise TemplateError(message)
    globals["strftime_now"] = datetime.now().strftime(format)

and templates are rendered as render_jinja_template does:
    template.render(messages=..., tools=tools or None, documents=None, add_generation_prompt=..., **special_tokens,
                    **template_kwargs)
(special tokens that are None are left out, as in special_tokens_map).

Usage: python3 tools/make_chat_template_cases.py   (needs only `pip install jinja2`)
Writes tests/fixtures/chat_templates/cases.json. Everything is deterministic: strftime_now is only used by the
snippet cases with a fixed format-free check (the C++ test compares those through a placeholder).
"""
import json
import os
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures", "chat_templates")


class GenerationTag(jinja2.ext.Extension):
    """transformers' AssistantTracker as far as rendering goes: {% generation %} ... {% endgeneration %} renders
    its body unchanged (the tracker only records character offsets)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = make_env()


def render(source, messages, add_generation_prompt, extra, bos_token, eos_token):
    """Returns (text, None) or (None, error message)."""
    kwargs = {}
    if bos_token is not None:
        kwargs["bos_token"] = bos_token
    if eos_token is not None:
        kwargs["eos_token"] = eos_token
    kwargs.update(extra)
    tools = kwargs.pop("tools", None)
    documents = kwargs.pop("documents", None)
    try:
        return ENV.from_string(source).render(messages=messages, tools=tools, documents=documents,
                                              add_generation_prompt=add_generation_prompt, **kwargs), None
    except Exception as e:  # TemplateError, but also TypeError etc. from Python operations on bad input
        return None, f"{type(e).__name__}: {e}"


def token_content(tok):
    if tok is None:
        return None
    return tok["content"] if isinstance(tok, dict) else tok


# ---------------------------------------------------------------------------------------------------------------
# Conversations
# ---------------------------------------------------------------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city. Returns °C.",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "description": "City name, e.g. 北京"},
                                      "unit": {"type": "string", "enum": ["c", "f"]}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add",
        "description": "Adds two numbers.",
        "parameters": {"type": "object",
                       "properties": {"a": {"type": "number"}, "b": {"type": "number", "default": 1.5}},
                       "required": ["a"]}}},
]


def conversations(args_as_string):
    """(name, messages, extra) tuples; every one is rendered with add_generation_prompt false and true."""

    def args(d):
        return json.dumps(d, ensure_ascii=False) if args_as_string else d

    sys_user = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Hello! Who are you?"}]
    multi = [{"role": "system", "content": "Be brief."},
             {"role": "user", "content": "What is 2+2?"},
             {"role": "assistant", "content": "4"},
             {"role": "user", "content": "  And 3+3?  \n"}]
    thinking = [{"role": "user", "content": "Think about it: 7*6?"},
                {"role": "assistant", "content": "<think>\n6*7 is 42.\n</think>\n\n42"},
                {"role": "user", "content": "Thanks. Now 8*8?"},
                {"role": "assistant", "content": "<think>8 times 8</think>64"}]
    reasoning_field = [{"role": "user", "content": "Hi"},
                       {"role": "assistant", "content": "Hello there.", "reasoning_content": "Greet back."}]
    unicode_conv = [{"role": "system", "content": "你是一个有用的助手。"},
                    {"role": "user", "content": "Ünïcödé ✓ 😀 — \"quotes\" and \\backslash\\ and\ttab"}]
    tool_conv = [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "Weather in Paris and 2+3?"},
        {"role": "assistant", "content": None if args_as_string else "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": args({"city": "Paris", "unit": "c"})}},
            {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": args({"a": 2, "b": 3})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
        {"role": "tool", "tool_call_id": "call_2", "content": "5"},
        {"role": "assistant", "content": "It is 21 °C in Paris, and 2+3=5."},
        {"role": "user", "content": "Thanks!"},
    ]
    out = [
        ("system_user", sys_user, {}),
        ("user_only", [{"role": "user", "content": "Hi"}], {}),
        ("multi_turn", multi, {}),
        ("thinking_in_content", thinking, {}),
        ("reasoning_content_field", reasoning_field, {}),
        ("unicode", unicode_conv, {}),
        ("enable_thinking_false", sys_user, {"enable_thinking": False}),
        ("enable_thinking_true", multi, {"enable_thinking": True}),
        ("tools_no_calls", sys_user, {"tools": TOOLS}),
        ("tool_calls", tool_conv, {"tools": TOOLS}),
    ]
    return out


# Which conversations each template gets (DeepSeek templates concatenate arguments as strings; the GLM ones
# iterate arguments.items(), so they need mappings; Qwen3 takes either).
TEMPLATES = {
    "qwen3": dict(args_as_string=False, extra_convs=True),
    "deepseek_v3": dict(args_as_string=True, extra_convs=False),
    "deepseek_r1": dict(args_as_string=True, extra_convs=False),
    "deepseek_v3_1": dict(args_as_string=True, extra_convs=False),
    "glm4_5": dict(args_as_string=False, extra_convs=True),
    "glm4_6": dict(args_as_string=False, extra_convs=True),
    "glm4_7": dict(args_as_string=False, extra_convs=True),
    "kimi_k2_thinking": dict(args_as_string=False, extra_convs=True),
}


def template_cases():
    cases = []
    for name, opts in TEMPLATES.items():
        source = open(os.path.join(FIXTURES, name + ".jinja"), encoding="utf-8").read()
        tokens = json.load(open(os.path.join(FIXTURES, name + ".json"), encoding="utf-8"))
        bos, eos = token_content(tokens.get("bos_token")), token_content(tokens.get("eos_token"))
        convs = conversations(opts["args_as_string"])
        if name == "qwen3":  # both argument forms
            convs.append(("tool_calls_string_args", conversations(True)[-1][1], {"tools": TOOLS}))
        if opts["extra_convs"]:
            convs.append(("content_parts", [{"role": "user", "content": [{"type": "text", "text": "part one, "},
                                                                        {"type": "text", "text": "part two"}]}],
                          {}))
        if name == "glm4_7":
            convs.append(("clear_thinking_false", conversations(False)[3][1], {"clear_thinking": False}))
        if name == "deepseek_v3_1":
            convs.append(("thinking_true", conversations(True)[0][1], {"thinking": True}))
        for conv_name, messages, extra in convs:
            for agp in (False, True):
                text, err = render(source, messages, agp, extra, bos, eos)
                case = {"template": name, "name": f"{conv_name}/agp={int(agp)}", "messages": messages,
                        "add_generation_prompt": agp, "extra": extra}
                if err is None:
                    case["expected"] = text
                else:
                    case["expected_error"] = err
                cases.append(case)
    return cases


# ---------------------------------------------------------------------------------------------------------------
# Snippets: small templates exercising one feature each, rendered by jinja2 over a fixed context
# ---------------------------------------------------------------------------------------------------------------

SNIPPET_CONTEXT = {
    "s": "  Hello, World  ", "n": 7, "f": 2.5, "neg": -3, "t": True, "z": None, "e": "",
    "xs": [3, 1, 2], "words": ["b", "A", "c", "a"], "d": {"b": 1, "a": [1, 2.0, None, True], "c": {"x": "é"}},
    "people": [{"name": "ann", "age": 31, "admin": True}, {"name": "bob", "age": 25, "admin": False},
               {"name": "cy", "age": 40}],
    "u": "añb€😀c",
}

SNIPPETS = [
    # text, comments, whitespace control, trim_blocks / lstrip_blocks
    "a {# comment #} b",
    "line1\n  {% if t %}\n    yes\n  {% endif %}\nline2\n",
    "x  {%- if t -%}   y   {%- endif -%}  z",
    "{{ 'a' }}  \n  {{- 'b' -}}  \n  {{ 'c' }}",
    "  {%+ if t %}kept{% endif +%}\nafter",
    "a\n  {# c #}\nb",
    "{% raw %}{{ not evaluated }} {% if %}{% endraw %}",
    "  {%- raw -%}  {{ x }}  {%- endraw -%}  !",
    "{% if t %}\r\nwin\r\n{% endif %}\r\n",
    "trailing newline dropped\n",
    # literals and operators
    "{{ 1 + 2 * 3 - 4 / 2 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ 1e-5 }}|{{ 1e16 }}",
    "{{ 0.1 + 0.2 }}|{{ 1.0 }}|{{ 3.0 * 2 }}|{{ 10 / 4 }}|{{ 1_000 }}|{{ 12345678901234.5 }}|{{ 0.0001 }}",
    "{{ 'a' ~ 1 ~ none ~ true ~ undefined_var }}|{{ 'ab' + 'cd' }}|{{ 'x' * 3 }}|{{ [1] + [2, 3] }}",
    "{{ \"it's\" }}|{{ 'say \"hi\"' }}|{{ 'tab\\tnew\\nline\\\\' }}|{{ '\\u00e9\\x41' }}",
    "{{ [1, 'a', none, true, 2.5, [], {}] }}|{{ {'k': 'v', 'n': 1} }}|{{ (1, 2) }}|{{ ('a',) }}",
    "{{ ['it\\'s', \"q\\\"\", '\\n'] }}",
    "{{ True }}{{ False }}{{ None }}{{ true and false }}{{ none or 'x' }}{{ 0 or '' }}{{ 1 and 2 }}",
    "{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}{{ 1 == 1.0 }}{{ true == 1 }}{{ 1 != 2 }}",
    "{{ 'b' in 'abc' }}{{ 2 in xs }}{{ 'a' in d }}{{ 'q' not in d }}{{ not t }}{{ not (1 in xs) }}",
    "{{ 'yes' if t else 'no' }}|{{ 'yes' if z else 'no' }}|{{ 'only-if' if z }}|",
    "{{ s[2] }}{{ s[-3] }}|{{ xs[0] }}{{ xs[-1] }}|{{ s[2:7] }}|{{ xs[::-1] }}|{{ s[::2] }}|{{ u[1:4] }}|{{ u[::-1] }}",
    "{{ d.b }}{{ d['b'] }}{{ d.a[1] }}{{ d.c.x }}{{ d['c']['x'] }}|{{ d.missing }}|{{ xs.5 }}|{{ d.a.0 }}",
    "{{ n - -3 }}{{ -n }}{{ +n }}{{ -f|abs }}{{ neg|abs }}",
    # variables / set / namespace / scoping
    "{% set a = 5 %}{% set b = a * 2 %}{{ a }},{{ b }}",
    "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i * 10 %}{{ x }};{% endfor %}{{ x }}",
    "{% set x = 1 %}{% if t %}{% set x = 2 %}{% endif %}{{ x }}",
    "{% set ns = namespace(c=0, items=[]) %}{% for i in xs %}{% set ns.c = ns.c + i %}{% endfor %}{{ ns.c }}{{ ns.items }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = (3, 4) %}{{ c[1] }}",
    "{% set blk %}inner {{ n }}{% endset %}[{{ blk }}]",
    "{% with q = 4, r = 5 %}{{ q + r }}{% endwith %}{{ q is defined }}",
    # for loops
    "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}:{{ x }} {% endfor %}",
    "{% for x in xs if x > 1 %}{{ loop.index }}/{{ loop.length }}={{ x }} {% else %}none{% endfor %}",
    "{% for x in [] %}a{% else %}empty{% endfor %}{% for x in undefined_var %}b{% else %}undef-empty{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{% for c in 'héllo' %}{{ c }}.{% endfor %}",
    "{% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}|{% endfor %}",
    "{% for x in xs %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for x in xs %}{{ loop.previtem }}>{{ x }}>{{ loop.nextitem }} {{ loop.cycle('odd', 'even') }};{% endfor %}",
    "{% for p in people|selectattr('admin', 'defined') %}{{ p.name }}{% endfor %}",
    # macros
    "{% macro m(a, b=2, c='x') %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, 3) }}|{{ m(1, c='y') }}",
    "{% macro outer(v) %}<{{ inner(v) }}>{% endmacro %}{% macro inner(v) %}{{ v | upper }}{% endmacro %}{{ outer('q') }}",
    "{% macro va() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ va(1, 2, k=3) }}",
    "{% set g = 1 %}{% macro sees() %}{{ g }}{% endmacro %}{% set g = 2 %}{{ sees() }}",
    "{% macro m2(x) %}{% if x %}{{ x }}{% else %}none{% endif %}{% endmacro %}{% set r = m2('') %}[{{ r }}]{{ r.endswith('ne') }}",
    # filters
    "{{ s|trim }}|{{ s|length }}|{{ s|lower }}|{{ s|upper }}|{{ 'hELLO wORLD'|capitalize }}|{{ 'hello big-world'|title }}",
    "{{ xs|length }}{{ xs|count }}{{ d|length }}{{ xs|first }}{{ xs|last }}{{ 'abc'|first }}{{ xs|sum }}{{ xs|min }}{{ xs|max }}",
    "{{ xs|join(',') }}|{{ xs|join }}|{{ people|join(', ', attribute='name') }}|{{ 'abc'|list }}|{{ xs|reverse|list }}|{{ 'abc'|reverse }}",
    "{{ words|sort }}|{{ words|sort(reverse=true) }}|{{ words|sort(case_sensitive=true) }}|{{ people|sort(attribute='age')|map(attribute='name')|list }}",
    "{{ words|unique|list }}|{{ [1, 2, 1, 3]|unique|list }}|{{ xs|map('string')|join('-') }}|{{ people|map(attribute='age')|list }}",
    "{{ people|selectattr('admin')|map(attribute='name')|list }}|{{ people|rejectattr('admin')|map(attribute='name')|list }}|{{ people|selectattr('age', 'gt', 30)|map(attribute='name')|join }}",
    "{{ people|selectattr('name', 'equalto', 'bob')|list|length }}|{{ xs|select('odd')|list }}|{{ xs|reject('odd')|list }}|{{ [none, 1, '']|select|list }}",
    "{{ undefined_var|default('dflt') }}|{{ e|default('dflt') }}|{{ e|default('dflt', true) }}|{{ z|d('zz') }}|{{ z|default('zz', boolean=true) }}",
    "{{ 'a-b-c'|replace('-', '+') }}|{{ 'a-b-c'|replace('-', '', 1) }}|{{ 3.7|int }}|{{ '42'|int }}|{{ 'x'|int }}|{{ '2.5'|float }}|{{ 3|float }}",
    "{{ 2.5|round }}|{{ 3.5|round }}|{{ 2.567|round(2) }}|{{ 2.4|round(0, 'ceil') }}|{{ 2.6|round(0, 'floor') }}|{{ 7|round }}",
    "{{ d|items|list }}|{{ d|list }}|{{ n|string ~ '!' }}|{{ '<a&b>'|safe }}|{{ '<a&\"b\">'|e }}|{{ 'one two  three'|wordcount }}",
    "{{ d|tojson }}|{{ words|tojson }}|{{ 'ü'|tojson }}|{{ u|tojson(ensure_ascii=True) }}|{{ z|tojson }}|{{ f|tojson }}",
    "{{ d|tojson(indent=2) }}|{{ people[0]|tojson(separators=(',', ':')) }}|{{ d|tojson(sort_keys=true) }}",
    "{{ 'ctrl\\u0001\\u007f\\u2028'|tojson }}|{{ [1.0, 1e-7, 1e22, -0.0, 100.0]|tojson }}",
    "{{ 'x\\ny'|indent(2) }}|{{ 'x\\n\\ny'|indent(2, true) }}|{{ 'x\\n\\ny'|indent(2, blank=true) }}",
    "{% filter upper %}shout {{ n }}{% endfilter %}|{{ '%s=%d'|format('a', 3) }}|{{ 'ab'|center(6) }}|",
    "{{ [[1, 2], [3]]|map('length')|list }}|{{ people|map(attribute='admin', default=false)|list }}|{{ xs|batch(2)|list }}",
    "{{ xs|map('abs')|list }}{{ xs|attr('missing') }}{{ d|dictsort }}",
    # tests
    "{{ n is number }}{{ n is integer }}{{ f is float }}{{ t is boolean }}{{ t is number }}{{ t is integer }}{{ z is none }}{{ s is string }}",
    "{{ d is mapping }}{{ xs is mapping }}{{ xs is iterable }}{{ s is iterable }}{{ n is iterable }}{{ xs is sequence }}{{ d is sequence }}",
    "{{ undefined_var is defined }}{{ undefined_var is undefined }}{{ d.missing is defined }}{{ n is defined }}{{ undefined_var is iterable }}",
    "{{ t is true }}{{ 1 is true }}{{ false is false }}{{ 0 is false }}{{ n is odd }}{{ n is even }}{{ 9 is divisibleby 3 }}{{ n is not none }}",
    "{{ 3 is eq 3 }}{{ 3 is equalto 4 }}{{ 3 is ne 4 }}{{ 3 is lt 4 }}{{ 3 is ge 4 }}{{ 'a' is in 'cat' }}{{ 2 is in xs }}{{ 'ab' is lower }}{{ 'AB' is upper }}",
    "{{ z is sameas none }}{{ t is sameas true }}{{ 'abc'.startswith('a') is true }}{{ people is sequence }}{{ range is callable }}",
    # string methods
    "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxhixx'.strip('x') }}|{{ '\\n\\nhi\\n'.lstrip('\\n') }}|{{ 'ab\\n\\n'.rstrip('\\n') }}",
    "{{ 'a b  c '.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'x</think>y</think>z'.split('</think>')[-1] }}|{{ 'a b c'.rsplit(' ', 1) }}",
    "{{ s.startswith('  He') }}{{ s.endswith('d  ') }}{{ 'abc'.startswith(('x', 'a')) }}{{ 'abc'.endswith('b', 0, 2) }}",
    "{{ 'aXbX'.replace('X', '-') }}|{{ 'aXbX'.replace('X', '-', 1) }}|{{ 'hello'.upper() }}|{{ 'HeLLo'.lower() }}|{{ 'hello world'.title() }}|{{ 'hello World'.capitalize() }}",
    "{{ 'hello'.find('l') }}{{ 'hello'.find('z') }}{{ 'hello'.rfind('l') }}{{ 'hello'.count('l') }}{{ 'añb€'.find('€') }}{{ '42'.isdigit() }}{{ 'ab'.isalpha() }}",
    "{{ '{} and {}'.format('x', 2) }}|{{ '{0}{1}{0}'.format('a', 'b') }}|{{ '{name}!'.format(name='hi') }}|{{ ', '.join(['a', 'b']) }}|{{ 'a\\nb\\r\\nc'.splitlines() }}",
    "{{ 'x'.zfill(3) }}|{{ 'abc'.center(7, '*') }}|{{ ' '.isspace() }}|{{ 'Ab'.swapcase() }}|{{ 'a-b'.partition('-') }}",
    # dict methods / list methods
    "{{ d.keys()|list }}|{{ d.values()|list|length }}|{{ d.get('b') }}|{{ d.get('zz') }}|{{ d.get('zz', 'dflt') }}|{{ d.items()|list|length }}",
    "{{ xs.index(2) }}|{{ [1, 1, 2].count(1) }}|{{ d.copy() }}",
    # globals
    "{{ range(3)|list }}|{{ range(1, 7, 2)|list }}|{{ range(5, 0, -2)|list }}|{{ dict(a=1, b='x') }}|{{ namespace(a=1).a }}",
    "{{ namespace(d, extra=2).b }}|{% set ns2 = namespace() %}{% set ns2.v = 'set' %}{{ ns2.v }}",
    "{% generation %}gen {{ n }}{% endgeneration %}",
    # more whitespace-control corners
    "{{ n }}  {% if t %}same-line{% endif %}\n\t{% if t %}tab{% endif %}\n  {#- c #}  x\n{%- raw %} r {% endraw %}",
    "{% for x in xs %}\n  {% if x > 1 %}\n    big {{ x }}\n  {% elif x == 1 %}\n    one\n  {% else %}\n    other\n  {% endif %}\n{% endfor %}",
    "{% macro m(a) %}\n  [{{ a }}]\n{% endmacro %}\n{{ m(1) }}\n{{- m(2) -}}\n  end",
    "  {{ 'var lines keep indentation' }}\n  {%- if t %} a {% endif -%}\n  b",
    # more expressions
    "{{ ['a\\'b\"c', \"d'e\"] }}|{{ {'a': none, 'b': [t]} }}|{{ 1e22 }}|{{ 123456789012345678.0 }}|{{ 1.5e-10 }}|{{ -0.5 }}",
    "{{ 1.0 in [1] }}{{ [1, 'a']|join('-') }}{{ (1, 2)|tojson }}{{ not 1 in xs }}{{ not z is none }}{{ -1|abs }}{{ z|default(none) is none }}",
    "{{ 'a' 'b' }}|{{ [1, 2, 3][-1:] }}|{{ 'abc'[5:] }}|{{ (range(10)|list)[2:5] }}|{{ xs[1:-1] }}",
    "{% for a, b in [[1, 2], [3, 4]] %}{{ a }}{{ b }}{% endfor %}|{{ people|selectattr('admin', 'equalto', true)|list|length }}",
    "{{ 'abc' is string and 'x' }}|{{ none is not none }}|{{ 'é' < 'z' }}|{{ 'b' > 'a' }}|{{ '%.2f'|format(3.14159) }}|{{ '%5s|%-3d|'|format('ab', 7) }}",
    "{{ 5 // 2.0 }}|{{ 2 ** 0.5 }}|{{ 10 % 3.5 }}|{{ -7.5 // 2 }}|{{ true + 1 }}|{{ [1, 2] == [1, 2] }}|{{ (1, 2) == [1, 2] }}|{{ {'a': 1} == {'a': 1.0} }}",
    "{% set ns = namespace(a=1) %}{{ ns is mapping }}{{ ns.a }}{% macro m() %}{{ ns.a }}{% endmacro %}{% set ns.a = 2 %}{{ m() }}",
    "{% for x in xs %}{% macro inner() %}{{ x }}{% endmacro %}{{ inner() }}{% endfor %}|{% for x in [1] %}{{ loop.index }}{% for y in [5, 6] %}{{ loop.index }}{% endfor %}{{ loop.index }}{% endfor %}",
    "{{ 'a\u3000b c'.split() }}|{{ '\u3000x\u00a0'.strip() }}|{{ '  x\t'|trim }}|{{ 'x\u00a0'|trim|length }}",
    "{{ d|tojson(indent='\t') }}|{{ [[], {}, [[]]]|tojson(indent=1) }}|{{ {'z': 1, 'a': {'y': 2, 'b': 3}}|tojson(sort_keys=true, indent=0) }}",
    "{{ {1: 'int key', none: 'n', true: 'b'}|tojson }}|{{ {'k': 1}|tojson(separators=[',', '=']) }}|{{ 'é😀'|tojson(ensure_ascii=true) }}",
    "{% set s2 = 'The Quick brown' %}{{ s2|lower|replace(' ', '_') }}|{{ s2.lower().split()|map('capitalize')|join(' ') }}|{{ s2|wordcount }}|{{ s2[4:9]|upper }}",
    "{% if xs|length > 2 and (d.b == 1 or z) and not e %}ok{% endif %}|{{ xs|map('string')|map('upper')|list }}|{{ people|map(attribute='name')|map('title')|join(',') }}",
    "{{ people|sort(attribute='name', reverse=true)|map(attribute='name')|join }}|{{ people|max(attribute='age') }}|{{ words|min }}|{{ ['b', 'A']|max }}|{{ people|sum(attribute='age') }}",
    # Undefined behaviour
    "[{{ nothing }}]{% if nothing %}yes{% else %}no{% endif %}{{ nothing|length }}{{ nothing|string }}{{ nothing|list }}[{{ nothing|trim }}]",
    "{{ d.nope }}|{{ z.attr }}|{{ s.nope }}|{{ xs[10] }}|{{ d['nope'] is defined }}",
    # numbers and %-formats at the edges (found by fuzz/fuzz_chat_template: literals beyond double, widths
    # beyond a fixed buffer, floats beyond int64)
    "{{ 1e999 }}|{{ -1e999 }}|{{ 1e-999 }}|{{ 2.5e-320 }}|{{ 1_000.5 }}",
    "[{{ '%200s'|format('x') }}]|{{ '%.3d|%05.1f|%-6.2s|'|format(5, 3.14159, 'abc') }}|{{ '%d|%i'|format(3.7, -2.9) }}",
    "{{ '%d'|format(1e20) }}|{{ '%d'|format(-1e300)|length }}|{{ '%+d|% d'|format(True, 4.0) }}|{{ '%300.250f'|format(1.5)|length }}",
    "{{ xs|map(attribute='99999999999999999999999')|list }}|{{ people|map(attribute='0')|list }}",
    "{{ '%000000000000000000005d|%--5d|%++d|%  d|%-0-6.2f|'|format(42, 7, 3, 4, 2.5) }}",
    "{{ 1e308|round(250) }}|{{ 123.456|round(300) }}|{{ -0.5|round }}|{{ 123.0|round(-400) }}",
    "{{ 2 ** 62 }}|{{ -9223372036854775807 - 1 }}|{{ 7 // -1 }}|{{ -7 % -1 }}|{{ (2 ** 62) * -2 }}|{{ range(5, 9223372036854775807, 9223372036854775806)|list }}|{{ 'ab' * 3 }}|{{ 3 ** 0 }}|{{ (-3) ** 3 }}",
]

SNIPPET_ERRORS = [
    "{{ '%d'|format(f * 1e300 * 1e300) }}",
    "{{ '%d'|format(f * 1e300 * 1e300 - f * 1e300 * 1e300) }}",
    "{{ '{99999999999999999999999}'.format(1) }}",
    "{{ '{3}'.format(1) }}",
    "{{ nothing.attr }}",
    "{{ d.nope.deeper }}",
    "{{ nothing + 1 }}",
    "{{ raise_exception('Bad role: ' ~ n) }}",
    "{{ 1 / 0 }}",
    "{{ xs.append(4) }}",
    "{{ 'a' + 1 }}",
    "{{ 'a' < 1 }}",
    "{{ none_fn() }}",
    "{{ z|tojson ~ nothing|tojson }}",
    "{% for x in n %}{% endfor %}",
    "{{ d|sum }}",
]


def snippet_cases():
    out = []
    for src in SNIPPETS:
        try:
            text = ENV.from_string(src).render(**SNIPPET_CONTEXT)
            out.append({"source": src, "expected": text})
        except Exception as e:  # a snippet must render; report it
            raise SystemExit(f"snippet failed in jinja2: {src!r}: {type(e).__name__}: {e}")
    for src in SNIPPET_ERRORS:
        try:
            ENV.from_string(src).render(**SNIPPET_CONTEXT)
        except Exception as e:  # jinja2 raises TemplateError, TypeError, ZeroDivisionError...
            out.append({"source": src, "expected_error": f"{type(e).__name__}: {e}"})
            continue
        raise SystemExit(f"error snippet rendered without error: {src!r}")
    return out


def main():
    data = {
        "generated_by": "tools/make_chat_template_cases.py",
        "jinja2_version": jinja2.__version__,
        "snippet_context": SNIPPET_CONTEXT,
        "snippets": snippet_cases(),
        "cases": template_cases(),
    }
    path = os.path.join(FIXTURES, "cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum(1 for c in data["cases"] if "expected_error" in c)
    print(f"wrote {path}: {len(data['cases'])} template cases ({n_err} expected errors), "
          f"{len(data['snippets'])} snippets")


if __name__ == "__main__":
    main()
