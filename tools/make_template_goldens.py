#!/usr/bin/python3
"""Golden outputs for the chat-template renderer (src/text/jinja*.c,
src/text/chat_template*.c), made with Debian's python3-jinja2 configured as
Hugging Face transformers configures it for apply_chat_template:

    ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                  extensions=[AssistantTracker, loopcontrols])
    filters["tojson"] = json.dumps(x, ensure_ascii=False, indent=..., ...)
    globals["raise_exception"] raises TemplateError(message)
    globals["strftime_now"](fmt) = datetime.now().strftime(fmt)

with one change for reproducibility: strftime_now formats a fixed time,
2024-07-26 10:30:00 UTC (epoch 1721989800), which the C tests pass as
at_jinja_options.fixed_time.

Writes (run from the repository root: /usr/bin/python3 tools/make_template_goldens.py):
  tests/data/templates/micro_goldens.json  small templates probing the interpreter
  tests/data/templates/goldens.json        real templates x conversations, with
                                           assistant spans for loss masks
Templates and tokenizer configs are read from tests/data/templates/ (copied
there from shared/data, see tests/data/templates/SOURCES.md).
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DATA = os.path.join(ROOT, "tests", "data", "templates")
FIXED_TIME = datetime.datetime(2024, 7, 26, 10, 30, 0, tzinfo=datetime.timezone.utc)
assert int(FIXED_TIME.timestamp()) == 1721989800


class GenerationBlocks(Extension):
    """transformers' {% generation %} ... {% endgeneration %}: renders its body
    (the span tracking is not needed for the goldens)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_gen"), [], [], body).set_lineno(lineno)

    def _gen(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_TIME.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlocks, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = make_env()


def render(source, variables):
    """('ok', text) or ('error', kind, message)."""
    try:
        t = ENV.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        return ("error", "syntax", str(e))
    try:
        return ("ok", t.render(**variables))
    except jinja2.exceptions.TemplateError as e:
        kind = "raise" if type(e) is jinja2.exceptions.TemplateError else type(e).__name__
        return ("error", kind, str(e))
    except Exception as e:  # TypeError, ZeroDivisionError, ... from Python itself
        return ("error", type(e).__name__, str(e))


# ---------------------------------------------------------------- micro cases

MICRO = [
    # text, whitespace control, trim/lstrip blocks, comments, raw
    ("plain", "hello", {}),
    ("trailing newline dropped", "a\n", {}),
    ("only one trailing newline dropped", "a\n\n", {}),
    ("crlf normalized", "a\r\nb\rc", {}),
    ("trim_blocks", "{% if true %}\nx\n{% endif %}\ny", {}),
    ("lstrip_blocks", "  {% if true %}\n  x\n  {% endif %}\n  y  {{ 1 }}  {% if 1 %}z{% endif %}\n", {}),
    ("minus strips", "a  \n {%- if true -%}  \n b {{- 'c' -}} \n d {#- c -#}\n e {%- endif %}", {}),
    ("plus keeps", "a\n  {%+ if true +%}\nb\n  {%+ endif %}\n", {}),
    ("comment trims line", "a\n  {# comment #}\nb", {}),
    ("var does not lstrip", "x\n  {{ 'v' }}\n", {}),
    ("raw", "{% raw %}{{ not parsed }}{% endraw %}!", {}),
    ("unicode spaces stripped by minus", "a\u3000 {{- 'b' }}", {}),
    # literals and printing
    ("literals", "{{ 1 }} {{ 1.5 }} {{ 'a' \"b\" }} {{ true }} {{ None }} {{ [1, 'x', none] }} {{ (1,) }} {{ (1, 2) }} {{ {'a': 1, 'b': [True]} }}", {}),
    ("float repr", "{{ 1e20 }} {{ 1e-5 }} {{ 0.1 + 0.2 }} {{ 1/3 }} {{ 2.0 }} {{ 1e16 }} {{ 1e15 }} {{ 123456789.125 }} {{ -0.0 }}", {}),
    ("string escapes", r"{{ 'a\nb\t\x41\u00e9\\ \'q\' \d' }}", {}),
    ("repr quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'nl\\n', 'é', '\\x01'] }}", {}),
    ("undefined prints empty", "[{{ nothing }}]", {}),
    # arithmetic and operators
    ("arith", "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 4 / 2 }} {{ 3 - 5 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }}", {}),
    ("float arith", "{{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 1.5 * 2 }}", {}),
    ("concat tilde", "{{ 1 ~ 'a' ~ none ~ [1] ~ nothing }}", {}),
    ("string repeat", "{{ 'ab' * 3 }}{{ [0] * 2 }}", {}),
    ("list plus", "{{ [1] + [2, 3] }}", {}),
    ("str plus int error", "{{ 'a' + 1 }}", {}),
    ("undefined plus error", "{{ nothing + 1 }}", {}),
    ("div by zero", "{{ 1 / 0 }}", {}),
    ("compare chain", "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ true == 1 }} {{ none == none }}", {}),
    ("compare error", "{{ 1 < 'a' }}", {}),
    ("in", "{{ 'a' in 'cat' }} {{ 'z' not in 'cat' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'x' in nothing }} {{ '' in 'abc' }}", {}),
    ("and or values", "{{ 0 or 'x' }} {{ 1 and 'y' }} {{ '' and 1 }} {{ none or none }} {{ not 0 }} {{ not [1] }}", {}),
    ("inline if", "{{ 'y' if 1 else 'n' }} {{ 'y' if 0 else 'n' }} [{{ 'y' if 0 }}] {{ (1 if false) is defined }}", {}),
    ("dict equality", "{{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }} {{ [1, {'x': [2]}] == [1, {'x': [2]}] }}", {}),
    # variables, scoping
    ("set", "{% set x = 1 %}{% set y, z = 2, 3 %}{{ x }}{{ y }}{{ z }}", {}),
    ("loop scope", "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = 5 %}{{ x }}{% endfor %}{{ x }}", {}),
    ("loop scope fresh each iteration", "{% for i in [1, 2] %}{% if i == 2 %}[{{ y }}]{% endif %}{% set y = i %}{% endfor %}[{{ y }}]", {}),
    ("if leaks", "{% if true %}{% set z = 3 %}{% endif %}{{ z }}", {}),
    ("namespace", "{% set ns = namespace(a=1, b='x') %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}{{ ns.b }}{{ ns.c is defined }}", {}),
    ("namespace empty then set", "{% set ns = namespace() %}{% set ns.index = 0 %}{% set ns.index = ns.index + 1 %}{{ ns.index }}", {}),
    ("set non-namespace attr error", "{% set d = {} %}{% set d.x = 1 %}", {}),
    ("set block", "{% set b %}x{{ 1 + 1 }}y{% endset %}[{{ b }}]{% set c | upper %}abc{% endset %}{{ c }}", {}),
    ("with", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]", {}),
    ("vars override", "{{ bos_token }}{{ x.y }}", {"bos_token": "<s>", "x": {"y": [1, 2]}}),
    # control flow
    ("if elif else", "{% for i in [1, 2, 3] %}{% if i == 1 %}a{% elif i == 2 %}b{% else %}c{% endif %}{% endfor %}", {}),
    ("for else", "{% for i in [] %}x{% else %}empty{% endfor %}", {}),
    ("for filter", "{% for i in range(10) if i is odd %}{{ i }}{{ loop.index }}/{{ loop.length }}{{ ',' if not loop.last }}{% endfor %}", {}),
    ("loop vars", "{% for x in 'abc' %}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.previtem }}{{ loop.nextitem }}|{% endfor %}", {}),
    ("loop cycle changed", "{% for x in [1, 1, 2] %}{{ loop.cycle('a', 'b') }}{{ loop.changed(x) }}{% endfor %}", {}),
    ("nested loops", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.depth }}{% endfor %}{% endfor %}", {}),
    ("tuple unpack", "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}", {}),
    ("dict iteration", "{% for k in {'z': 1, 'a': 2} %}{{ k }}{% endfor %}", {}),
    ("break continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
    ("recursive loop", "{% for n in tree recursive %}({{ n.name }}{% if n.kids %}{{ loop(n.kids) }}{% endif %}){% endfor %}",
     {"tree": [{"name": "a", "kids": [{"name": "b", "kids": []}, {"name": "c"}]}]}),
    ("macro", "{% macro m(a, b=2, c='z') %}[{{ a }}{{ b }}{{ c }}{{ x }}]{% endmacro %}{% set x = 9 %}{{ m(1) }}{{ m(1, c=3) }}{{ m(a=0, b=1) }}", {}),
    ("macro recursion", "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(4) }}", {}),
    ("filter block", "{% filter upper %}abc{{ 'd' }}{% endfilter %}", {}),
    ("raise_exception", "a{{ raise_exception('Conversation roles must alternate!') }}", {}),
    # attribute and item access
    ("getattr getitem", "{{ d.a }} {{ d['a'] }} {{ d.items is callable }} {{ d['items'] }} {{ l[0] }} {{ l[-1] }} {{ l.0 }} [{{ l[5] }}] [{{ d.nope }}]",
     {"d": {"a": 1, "items": "I"}, "l": [10, 20]}),
    ("undefined attr error", "{{ nothing.attr }}", {}),
    ("none attr is undefined", "{{ n.x is defined }}", {"n": None}),
    ("str attr undefined", "{{ 'abc'.content is defined }}", {}),
    ("slicing", "{{ [1, 2, 3, 4][1:] }}{{ [1, 2, 3, 4][:-1] }}{{ [1, 2, 3, 4][::-1] }}{{ [1, 2, 3, 4][::2] }}{{ 'héllo'[1:3] }}{{ 'héllo'[::-1] }}{{ 'abc'[-1] }}{{ 'héllo'[1] }}{{ [1, 2, 3][5:] }}{{ [1, 2, 3][-5:2] }}", {}),
    # string methods
    ("str methods", "{{ '  x y  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\\n a'.lstrip() }}|{{ 'a \\n'.rstrip() }}|{{ 'a\\nb'.rstrip('\\n') }}", {}),
    ("split", "{{ 'a b  c '.split() }}{{ 'a,b,,c'.split(',') }}{{ 'a,b,c'.split(',', 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ '  a b '.split(None, 1) }}{{ 'x</think>y</think>z'.split('</think>')[-1] }}", {}),
    ("case", "{{ 'hello World'.upper() }} {{ 'HeLLo'.lower() }} {{ 'hello wORLD it\\'s'.title() }} {{ 'hELLO'.capitalize() }} {{ 'héllo'.upper() }}", {}),
    ("startswith", "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith('lo') }} {{ 'hello'.startswith(('x', 'h')) }} {{ 'a'.startswith('ab') }}", {}),
    ("replace find count join", "{{ 'aaa'.replace('a', 'b', 2) }} {{ 'hello'.find('l') }} {{ 'héllo'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'x'.find('z') }} {{ 'banana'.count('an') }} {{ '-'.join(['a', 'b']) }}", {}),
    ("str predicates", "{{ '123'.isdigit() }} {{ 'ab'.isalpha() }} {{ 'AB'.isupper() }} {{ 'ab1'.islower() }} {{ ' '.isspace() }} {{ ''.isdigit() }}", {}),
    ("dict methods", "{{ d.keys() | list }} {{ d.values() | list }} {{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 5) }} {{ d.items() | list }}", {"d": {"a": 1, "b": [2]}}),
    ("list methods", "{{ [1, 2, 2].count(2) }} {{ [1, 2].index(2) }}", {}),
    # filters
    ("trim length", "[{{ '  a  ' | trim }}] {{ 'héllo' | length }} {{ [1, 2] | length }} {{ {'a': 1} | count }} {{ nothing | length }} [{{ 'xxyxx' | trim('x') }}]", {}),
    ("default", "{{ nothing | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} {{ none | default('d') }} {{ 0 | d(5, boolean=true) }}", {}),
    ("upper lower title capitalize", "{{ 'ab' | upper }} {{ 'AB' | lower }} {{ 'hello-world foo(bar' | title }} {{ 'hELLO wORLD' | capitalize }}", {}),
    ("join", "{{ [1, 2, 3] | join(', ') }} {{ ['a', 'b'] | join }} {{ users | join(',', attribute='name') }}", {"users": [{"name": "x"}, {"name": "y"}]}),
    ("replace filter", "{{ 'aXbX' | replace('X', '-') }} {{ 'aaa' | replace('a', 'b', 1) }}", {}),
    ("first last list", "{{ [3, 4] | first }} {{ [3, 4] | last }} {{ 'ab' | list }} {{ [] | first is defined }}", {}),
    ("items filter", "{% for k, v in {'x': 1, 'y': [2]} | items %}{{ k }}{{ v }}{% endfor %}", {}),
    ("dictsort", "{{ {'b': 1, 'A': 2, 'c': 0} | dictsort }} {{ {'b': 1, 'a': 2} | dictsort(by='value') }} {{ {'b': 1, 'a': 2} | dictsort(reverse=true) }}", {}),
    ("sort unique min max sum", "{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'a'] | sort }} {{ ['b', 'A', 'a'] | sort(case_sensitive=true) }} {{ [3, 1] | sort(reverse=true) }} {{ [1, 2, 1] | unique | list }} {{ [3, 1, 2] | max }} {{ [3, 1, 2] | min }} {{ [1, 2, 3] | sum }} {{ users | sort(attribute='age') | map(attribute='name') | list }}",
     {"users": [{"name": "x", "age": 3}, {"name": "y", "age": 1}]}),
    ("select reject", "{{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3, 4] | reject('odd') | list }} {{ [0, 1, '', 'a'] | select | list }} {{ ['a', 'b', 'code_interpreter'] | reject('equalto', 'code_interpreter') | join(', ') }}", {}),
    ("selectattr rejectattr", "{{ msgs | selectattr('role', 'equalto', 'user') | list | length }} {{ msgs | rejectattr('role', 'equalto', 'user') | map(attribute='content') | list }} {{ msgs | selectattr('x') | list }}",
     {"msgs": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "x": 1}, {"role": "user", "content": "c"}]}),
    ("map filter", "{{ ['a', 'b'] | map('upper') | list }} {{ [{'n': 1}, {}] | map(attribute='n', default=0) | list }}", {}),
    ("tojson", "{{ {'a': [1, 2.5, 'é\"\\\\\\n'], 'b': none, 'c': true, 'd': {}} | tojson }}", {}),
    ("tojson indent", "{{ {'a': [1, {'b': 2}], 'e': [], 'f': {}} | tojson(indent=4) }}", {}),
    ("tojson sort_keys", "{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}", {}),
    ("tojson string", "{{ 'say \"hi\"' | tojson }} {{ 1 | tojson }} {{ none | tojson }}", {}),
    ("tojson undefined error", "{{ nothing | tojson }}", {}),
    ("string filter", "{{ {'type': 'function', 'function': {'name': 'f', 'flag': true, 'n': none, 'x': 1.0}} | string }} {{ 5 | string }}", {}),
    ("int float", "{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '0x1A' | int(base=16) }} {{ '2.5' | float }} {{ 3 | float }} {{ 'x' | float }}", {}),
    ("abs round", "{{ -3 | abs }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.567 | round(2) }} {{ 2.1 | round(method='ceil') }} {{ 2.9 | round(0, 'floor') }}", {}),
    ("reverse", "{{ 'abc' | reverse }} {{ [1, 2, 3] | reverse | list }}", {}),
    ("indent", "{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(2, blank=true) }}", {}),
    ("center truncate wordcount", "[{{ 'ab' | center(6) }}] {{ 'hello world foo bar' | truncate(9, leeway=0) }} {{ 'hello world foo bar' | truncate(9, true, leeway=0) }} {{ 'short' | truncate(9) }} {{ 'a b-c d' | wordcount }}", {}),
    ("escape safe format", "{{ '<a href=\"x\">&\\'' | e }} {{ 1 | safe }} {{ '%s-%d' | format('a', 3) }} {{ '%.2f' | format(3.14159) }}", {}),
    ("batch", "{{ [1, 2, 3, 4, 5] | batch(2) | list }} {{ [1, 2, 3] | batch(2, 'x') | list }}", {}),
    ("attr filter", "{% set ns = namespace(a=1) %}{{ ns | attr('a') }} {{ {'k': 1} | attr('k') is defined }}", {}),
    # tests
    ("tests", "{{ x is defined }} {{ nothing is undefined }} {{ none is none }} {{ 'a' is string }} {{ 1 is number }} {{ true is number }} {{ 1 is integer }} {{ true is integer }} {{ 1.0 is float }} {{ {} is mapping }} {{ [] is mapping }} {{ 'a' is iterable }} {{ 1 is iterable }} {{ [] is sequence }} {{ {} is sequence }} {{ 'a' is sequence }} {{ 1 is sequence }}", {"x": 1}),
    ("tests 2", "{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ true is boolean }} {{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 'a' is equalto 'a' }} {{ 2 is eq(2) }} {{ 1 is ne 2 }} {{ 3 is gt 2 }} {{ 3 is lt 2 }} {{ 3 is ge 3 }} {{ 3 is le 2 }} {{ 2 is in [1, 2] }} {{ 'ab' is lower }} {{ 'AB' is upper }} {{ none is sameas none }} {{ 'upper' is filter }} {{ 'odd' is test }} {{ m is callable }}",
     {"m": None}),
    ("is not", "{{ x is not none }} {{ x is not defined }} {{ not x is defined }}", {"x": 0}),
    ("test after filter", "{{ 'a' | upper is string }}", {}),
    # globals
    ("range", "{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(5, 0, -2) | list }} {{ range(0) | list }}", {}),
    ("dict global", "{{ dict(a=1, b='x') }}", {}),
    ("strftime_now", "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M:%S %A %B %j') }}|{{ strftime_now is defined }}", {}),
    # errors
    ("syntax error", "{% if x %}unclosed", {}),
    ("unknown tag", "{% frobnicate %}", {}),
    ("unknown filter", "{{ 1 | nosuchfilter }}", {}),
    ("bad expression", "{{ 1 + }}", {}),
    ("unclosed string", "{{ 'abc }}", {}),
    ("not callable", "{{ 'a'() }}", {}),
    ("iterate int", "{% for x in 5 %}{% endfor %}", {}),
]


def micro_goldens():
    out = []
    for name, src, variables in MICRO:
        r = render(src, variables)
        case = {"name": name, "template": src, "vars": variables}
        if r[0] == "ok":
            case["output"] = r[1]
        else:
            case["error_kind"] = r[1]
            case["error"] = r[2]
        out.append(case)
    return out


# ---------------------------------------------------------------- conversations

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

CONVERSATIONS = {
    "single": {"messages": [{"role": "user", "content": "Hello!"}]},
    "basic": {"messages": [
        {"role": "user", "content": "Hi, who are you?"},
        {"role": "assistant", "content": "I am a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"},
    ]},
    "system_multi": {"messages": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name a color."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one."},
        {"role": "assistant", "content": "Green."},
    ]},
    "system_single": {"messages": [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Good morning"},
    ]},
    "unicode": {"messages": [
        {"role": "user", "content": "  Translate: 你好，世界 🌍 \"quotes\" and \\backslash\\\n\tnext line  "},
        {"role": "assistant", "content": "\nHello, world 🌍 — «ça va?»\n"},
        {"role": "user", "content": "Merci ✓"},
    ]},
    "think": {"messages": [
        {"role": "user", "content": "Is 7 prime?"},
        {"role": "assistant", "content": "<think>\nDivisors of 7 are 1 and 7.\n</think>\n\nYes, 7 is prime."},
        {"role": "user", "content": "And 9?"},
        {"role": "assistant", "content": "<think>\n9 = 3 * 3.\n</think>\n\nNo."},
    ]},
    "no_thinking": {"messages": [{"role": "user", "content": "Quick answer: 1+1?"}],
                    "extra": {"enable_thinking": False}},
    "tools": {"tools": [WEATHER_TOOL], "messages": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call12345", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"temperature\": 21}"},
        {"role": "assistant", "content": "It is 21 °C in Paris."},
    ]},
    "tools_string_args": {"tools": [WEATHER_TOOL], "messages": [
        {"role": "user", "content": "Weather in Oslo and Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "callAAAAA", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}},
            {"id": "callBBBBB", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
        {"role": "tool", "tool_call_id": "callAAAAA", "content": "cold"},
        {"role": "tool", "tool_call_id": "callBBBBB", "content": "warm"},
        {"role": "assistant", "content": "Oslo is cold, Rome is warm."},
    ]},
    "not_alternating": {"messages": [
        {"role": "user", "content": "One"},
        {"role": "user", "content": "Two"},
    ]},
    "system_then_assistant": {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "assistant", "content": "Hello there."},
        {"role": "user", "content": "Hi"},
    ]},
}


def byte_len(s):
    return len(s.encode("utf-8"))


def lcp(a, b):
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def overlap(u, v):
    """Longest k with u[-k:] == v[:k]."""
    for k in range(min(len(u), len(v)), 0, -1):
        if u[len(u) - k:] == v[:k]:
            return k
    return 0


def content_core(msg):
    """What must appear in an assistant turn: its content after any </think>,
    stripped ("" when the content is not a string)."""
    c = msg.get("content")
    return c.split("</think>")[-1].strip() if isinstance(c, str) else ""


def cut_partial_tag(text, s, e, core):
    """If text[s:e] ends inside a tag ("<|" of "<|user|>", "<t" of "<think>"),
    after the content, end the span before that tag."""
    tail = s
    if core:
        k = text.rfind(core, s, e)
        if k >= 0:
            tail = k + len(core)
    for open_, close in (("<", ">"), ("[", "]")):
        k = text.rfind(open_, tail, e)
        if k >= 0 and text.find(close, k, e) < 0:
            e = k
    return e


def assistant_spans(render_fn, messages, last_only):
    """The masking rule of src/text/chat_template_mask.c, in characters:
    start = common prefix of render(messages[:i], generation prompt) and the
    full text; end = start + common prefix of the rest of render(messages[:i+1])
    and of the full text, or else the longest suffix of that rest which begins
    the full text's rest (templates that render the last turn differently).
    A common-prefix end inside a tag after the content ("<|" shared by
    "<|endoftext|>" and "<|user|>") is moved back before that tag. A span
    must be non-empty, contain content_core(message), and not contain the
    previous message's content unless that also appears before the span."""
    full = render_fn(messages, False)
    idxs = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if last_only:
        idxs = idxs[-1:]
    spans = []
    for i in idxs:
        p = render_fn(messages[:i], True)
        s = lcp(p, full)
        q = render_fn(messages[:i + 1], False)
        if lcp(q, full) < s:
            raise ValueError(f"message {i}: the text before the turn differs when it is the last message")
        u, v = q[s:], full[s:]
        core = content_core(messages[i])
        ok = lambda e: e > 0 and (not core or core in full[s:s + e])
        e = cut_partial_tag(full, s, s + lcp(u, v), core) - s
        if not ok(e):
            e = overlap(u, v)
            if not ok(e):
                raise ValueError(f"message {i}: cannot locate the assistant turn in the rendered text")
        prev = content_core(messages[i - 1]) if i > 0 else ""
        if prev and prev in full[s:s + e] and prev not in full[:s]:
            raise ValueError(f"message {i}: the span would swallow message {i - 1}; the template renders earlier "
                             "messages differently depending on later ones")
        if spans and s < spans[-1][1]:
            raise ValueError(f"message {i}: assistant spans overlap")
        spans.append((s, s + e))
    # characters -> bytes
    return [[byte_len(full[:a]), byte_len(full[:b])] for a, b in spans]


# ---------------------------------------------------------------- templates

def token_str(tok):
    if tok is None:
        return None
    if isinstance(tok, dict):
        return tok.get("content")
    return tok


SPECIAL_KEYS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]


def config_tokens(cfg):
    """transformers' special_tokens_map as template variables."""
    out = {}
    for k in SPECIAL_KEYS:
        v = token_str(cfg.get(k))
        if v is not None:
            out[k] = v
    extra = cfg.get("additional_special_tokens")
    if extra:
        out["additional_special_tokens"] = [token_str(x) for x in extra]
    return out


# templates from .jinja files, with the special tokens their models define
# (or the tokenizer config to take them from)
JINJA_TEMPLATES = [
    ("Qwen-Qwen2.5-7B-Instruct.jinja", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    ("Qwen-Qwen3-0.6B.jinja", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
     {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}),
    ("google-gemma-2-2b-it.jinja", {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    ("microsoft-Phi-3.5-mini-instruct.jinja", {"bos_token": "<s>", "eos_token": "<|endoftext|>"}),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", {"bos_token": "<s>", "eos_token": "</s>"}),
    ("smollm3/chat_template.jinja", "smollm3/tokenizer_config.json"),  # tokens from that config
    ("builtin/chatml.jinja", {"eos_token": "<|im_end|>"}),
    ("builtin/llama-2.jinja", {"bos_token": "<s>", "eos_token": "</s>"}),
    ("builtin/llama-3.jinja", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    ("builtin/mistral.jinja", {"bos_token": "<s>", "eos_token": "</s>"}),
    ("builtin/qwen.jinja", {"eos_token": "<|im_end|>"}),
    ("builtin/qwen2_5.jinja", {"eos_token": "<|im_end|>"}),
    ("builtin/internlm2.jinja", {"eos_token": "<|im_end|>"}),
    ("builtin/llama.jinja", {"bos_token": "<s>", "eos_token": "</s>"}),
    ("builtin/llama3_2.jinja", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
]

# tokenizer configs whose chat_template is not byte-identical to a .jinja above
CONFIG_TEMPLATES = ["llama3", "llama3-full", "mistral-7b-instruct-v0.3", "phi-3-mini", "qwen2", "qwen3"]

# The end of an assistant turn in each template family (checked by the C test:
# every assistant span must end with it, optionally followed by "\n").
TURN_END = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": "<|im_end|>", "Qwen-Qwen3-0.6B.jinja": "<|im_end|>",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "<｜end▁of▁sentence｜>",
    "google-gemma-2-2b-it.jinja": "<end_of_turn>", "meta-llama-Llama-3.1-8B-Instruct.jinja": "<|eot_id|>",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "<|eot_id|>", "microsoft-Phi-3.5-mini-instruct.jinja": "<|end|>",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "</s>", "smollm3/chat_template.jinja": "<|im_end|>",
    "builtin/chatml.jinja": "<|im_end|>", "builtin/llama-2.jinja": "</s>", "builtin/llama-3.jinja": "<|eot_id|>",
    "builtin/mistral.jinja": "</s>", "builtin/qwen.jinja": "<|im_end|>", "builtin/qwen2_5.jinja": "<|im_end|>",
    "builtin/internlm2.jinja": "<|im_end|>", "builtin/llama.jinja": "</s>", "builtin/llama3_2.jinja": "<|eot_id|>",
    "llama3": "<|eot_id|>", "llama3-full": "<|eot_id|>", "mistral-7b-instruct-v0.3": "</s>",
    "phi-3-mini": "<|end|>", "qwen2": "<|im_end|>", "qwen3": "<|im_end|>",
}


# Templates where the prefix rule gives spans with scaffolding in them (a
# known limit, reported by the C test instead of failing it).
SPAN_CHECK_EXEMPT = {
    "llama3-full": "the template appends the assistant header even without add_generation_prompt, so the text "
                   "after a turn begins like the next header: spans end with <|start_header_id|>",
}


def template_cases(source, tokens):
    cases = []
    for conv_name, conv in CONVERSATIONS.items():
        for agp in (False, True):
            variables = dict(tokens)
            variables.update(conv.get("extra", {}))
            variables.update(messages=conv["messages"], tools=conv.get("tools"), documents=None,
                             add_generation_prompt=agp)
            r = render(source, variables)
            case = {"conversation": conv_name, "add_generation_prompt": agp}
            if r[0] == "ok":
                case["output"] = r[1]
                if not agp:
                    def rf(msgs, gp):
                        v = dict(variables)
                        v.update(messages=msgs, add_generation_prompt=gp)
                        rr = render(source, v)
                        if rr[0] != "ok":
                            raise ValueError(f"prefix render failed: {rr[2]}")
                        return rr[1]
                    for key, last in (("spans_all", False), ("spans_last", True)):
                        try:
                            case[key] = assistant_spans(rf, conv["messages"], last)
                        except ValueError as e:
                            case[key + "_error"] = str(e)
            else:
                case["error_kind"] = r[1]
                case["error"] = r[2]
            cases.append(case)
    return cases


def main():
    micro = micro_goldens()
    with open(os.path.join(DATA, "micro_goldens.json"), "w", encoding="utf-8") as f:
        json.dump(micro, f, ensure_ascii=False, indent=1)
        f.write("\n")

    templates = []
    for fname, tokens in JINJA_TEMPLATES:
        if isinstance(tokens, str):
            with open(os.path.join(DATA, tokens), encoding="utf-8") as f:
                tokens = config_tokens(json.load(f))
        with open(os.path.join(DATA, fname), encoding="utf-8", newline="") as f:
            src = f.read()
        templates.append({"name": fname, "file": fname, "tokens": tokens, "turn_end": TURN_END[fname],
                          "cases": template_cases(src, tokens)})
    for cname in CONFIG_TEMPLATES:
        with open(os.path.join(DATA, "configs", cname, "tokenizer_config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        src = cfg["chat_template"]
        tokens = config_tokens(cfg)
        entry = {"name": cname, "config": "configs/" + cname, "tokens": tokens,
                 "turn_end": TURN_END[cname], "cases": template_cases(src, tokens)}
        if cname in SPAN_CHECK_EXEMPT:
            entry["span_check_exempt"] = SPAN_CHECK_EXEMPT[cname]
        templates.append(entry)
    convs = {k: {"messages": v["messages"], "tools": v.get("tools"), "extra": v.get("extra", {})}
             for k, v in CONVERSATIONS.items()}
    with open(os.path.join(DATA, "goldens.json"), "w", encoding="utf-8") as f:
        json.dump({"jinja2_version": jinja2.__version__, "fixed_time": 1721989800,
                   "conversations": convs, "templates": templates}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n = sum(len(t["cases"]) for t in templates)
    errs = sum(1 for t in templates for c in t["cases"] if "error" in c)
    print(f"{len(micro)} micro cases, {len(templates)} templates x {len(CONVERSATIONS) * 2} cases = {n} "
          f"({errs} expected errors)", file=sys.stderr)


if __name__ == "__main__":
    main()
