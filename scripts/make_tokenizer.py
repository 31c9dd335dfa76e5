#!/usr/bin/env python3
"""Build frigg's small, deterministic Gemma-4-style test tokenizer and its fixtures.

Writes tests/fixtures/tokenizer/:
  tokenizer.json         HF `tokenizers` BPE, same pipeline as Gemma's tokenizer.json
  tokenizer_config.json  Mimir-style (fix_mistral_regex, TokenizersBackend, chat_template)
  chat_template.jinja    frigg's own HRM-Text / Gemma-4 "native" chat template
  chat_cases.json        rendered example conversations + their ids
  probes.json            probe strings + their ids (raw tokenizer, add_special_tokens=False)

Vocabulary layout (ids match the Gemma-4 tokenizer Mimir ships where it matters):
  0 <pad>, 1 <eos>, 2 <bos>, 3 <unk>, 4 <mask>, 5..45 <unusedN>,
  46 <|tool>, 47 <tool|>, 48 <|tool_call>, 49 <tool_call|>, 50 <|tool_response>,
  51 <tool_response|>, 52 <|"|>, 53..104 <unusedN>, 105 <|turn>, 106 <turn|>,
  107 "\\n", 108 "\\n\\n", 109..364 byte-fallback tokens <0x00>..<0xFF>,
  365.. single characters of the corpus, then one token per learned merge.
Ids 0..108 are added tokens (as in Gemma, where 0..237 are); `special` is true for
pad/eos/bos/unk and the tool/turn tokens, false for <mask>, the fillers and the newlines
(as in the Gemma-3 file after the Gemma-4 renames).

The merges are learned here by a tiny, deterministic BPE trainer (pure Python) on the corpus
below, so the file is reproducible byte for byte without any training library.

Usage: python scripts/make_tokenizer.py [--out tests/fixtures/tokenizer]
"""

import argparse
import collections
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TARGET_VOCAB = 1280  # total vocabulary size (specials + bytes + chars + merges)

SPECIAL_NAMES = {
    0: "<pad>",
    1: "<eos>",
    2: "<bos>",
    3: "<unk>",
    4: "<mask>",
    46: "<|tool>",
    47: "<tool|>",
    48: "<|tool_call>",
    49: "<tool_call|>",
    50: "<|tool_response>",
    51: "<tool_response|>",
    52: '<|"|>',
    105: "<|turn>",
    106: "<turn|>",
    107: "\n",
    108: "\n\n",
}
SPECIAL_TRUE = {0, 1, 2, 3, 46, 47, 48, 49, 50, 51, 52, 105, 106}
N_ADDED = 109  # ids 0..108
BYTE_BASE = N_ADDED  # <0x00> is id 109

# Small bilingual corpus (written for this fixture). Danish with æøå, English, digits,
# punctuation, a bit of JSON-ish / tool vocabulary so the chat fixtures compress somewhat.
CORPUS = """\
Hej! Hvordan har du det i dag? Jeg har det fint, tak.
Vejret i København er koldt og blæsende, men solen skinner.
Der står en rød bil på gaden foran huset.
Børnene leger i haven, og hunden løber efter bolden.
Vi spiste æbler, pærer og blåbær til morgenmad.
Hvad er klokken? Den er kvart over syv om aftenen.
Det koster 125 kroner og 50 øre i butikken.
Århus er Danmarks næststørste by, og Aalborg ligger nordpå.
Jeg vil gerne have en kop kaffe med mælk, tak.
Må jeg låne din cykel i morgen? Ja, selvfølgelig.
Han skrev et langt brev til sin mormor på Fyn.
Øen ligger midt i havet, og færgen sejler hver time.
Hun læser en bog om dansk historie og kultur.
Skolen starter klokken otte, og frikvarteret er klokken ti.
Kan du hjælpe mig med at oversætte denne sætning til engelsk?
Svaret er 42, men spørgsmålet er stadig ukendt.
Toget til Odense kører fra spor 3 klokken 14:35.
Temperaturen var 21,5 grader i går og 18 grader i dag.
Hvor mange æg skal der i en kage? Mindst fire.
Vi ses på fredag! Husk at tage madpakke med.
Hello! How are you today? I am fine, thank you.
The weather in Copenhagen is cold and windy, but the sun is shining.
There is a red car parked on the street in front of the house.
The children play in the garden, and the dog runs after the ball.
We ate apples, pears and blueberries for breakfast.
What time is it? It is a quarter past seven in the evening.
It costs 125 kroner and 50 cents in the shop.
Aarhus is the second largest city in Denmark, and Aalborg is in the north.
I would like a cup of coffee with milk, please.
May I borrow your bicycle tomorrow? Yes, of course.
He wrote a long letter to his grandmother on Funen.
The island lies in the middle of the sea, and the ferry sails every hour.
She is reading a book about Danish history and culture.
School starts at eight o'clock, and the break is at ten.
Can you help me translate this sentence into English?
The answer is 42, but the question is still unknown.
The train to Odense leaves from platform 3 at 14:35.
The temperature was 21.5 degrees yesterday and 18 degrees today.
How many eggs go into a cake? At least four.
See you on Friday! Remember to bring a packed lunch.
The model answers the user; the system sets the rules.
You are a helpful assistant. Answer briefly and correctly.
Du er en hjælpsom assistent. Svar kort og præcist.
Call the function get_weather with the location and the unit.
Kald funktionen get_weather med stedet og enheden.
The tool returned a response with the value of the temperature.
declaration: description, parameters, properties, required, type, response, value, call.
STRING, INTEGER, NUMBER, BOOLEAN, OBJECT, ARRAY, enum, items, nullable.
{"location": "Aarhus", "unit": "celsius", "days": 3, "verbose": true}
[1, 2, 3, 4, 5, 6, 7, 8, 9, 10] and (a + b) * c = 100 - 7 / 2.
Prices: 9.99 USD, 12,50 DKK, 100 % sure; e-mail: test@example.com.
"Quoted text," she said. 'Single quotes' too -- and a dash - here.
Første, anden, tredje: én, to, tre, fire, fem, seks, syv, otte, ni, ti.
Æ, Ø og Å er store bogstaver; æ, ø og å er små.
fn main() { println!("hej verden"); } // kode i Rust
def add(a, b): return a + b  # Python code with two  spaces
Line one.  Line two after two spaces.   Three spaces here.
Naïve café, façade, jalapeño, über, smörgåsbord, fjord, hygge.
Mens vi venter på bussen, snakker vi om fodbold og musik.
While we wait for the bus, we talk about football and music.
Det var en dejlig dag ved stranden med is og sol.
It was a lovely day at the beach with ice cream and sun.
Kommunen har besluttet at bygge en ny skole i byen.
The council has decided to build a new school in the town.
Hvis du har spørgsmål, er du velkommen til at skrive til mig.
If you have any questions, you are welcome to write to me.
Regeringen præsenterede i dag et nyt forslag om grøn energi.
The government presented a new proposal on green energy today.
Forskerne målte 3,14 millimeter regn på 24 timer.
The researchers measured 3.14 millimetres of rain in 24 hours.
Hvilken farve har himlen? Himlen er blå, og græsset er grønt.
What colour is the sky? The sky is blue, and the grass is green.
"""


def byte_token(b: int) -> str:
    return f"<0x{b:02X}>"


def normalize(text: str) -> str:
    # The pipeline's normalizer: Replace(" " -> "▁").
    return text.replace(" ", "\u2581")


def is_digit(ch: str) -> bool:
    return ch.isdigit()


def chunk_words(line: str):
    """Split a normalized line into '▁'-prefixed chunks (merges never cross a word start)."""
    out, cur = [], ""
    for ch in line:
        if ch == "\u2581" and cur:
            out.append(cur)
            cur = ""
        cur += ch
    if cur:
        out.append(cur)
    return out


def train_bpe(corpus: str, n_merges: int):
    """Deterministic BPE: highest pair count wins, ties broken by the pair's strings
    (count-1 pairs too, so the tail of the merge list spells out whole corpus words).
    Digits never merge (like Gemma, which splits numbers into single digits)."""
    words = collections.Counter()
    for line in corpus.split("\n"):
        if line:
            for w in chunk_words(normalize(line)):
                words[tuple(w)] += 1
    chars = collections.Counter()
    for w, c in words.items():
        for ch in w:
            chars[ch] += c
    alphabet = sorted(chars, key=lambda ch: (-chars[ch], ch))
    merges = []
    words = dict(words)
    for _ in range(n_merges):
        pairs = collections.Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                if is_digit(a[-1]) or is_digit(b[0]) or b.startswith("\u2581"):
                    continue
                pairs[(a, b)] += c
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        a, b = best
        new_words = {}
        for w, c in words.items():
            if a not in w:
                new_words[w] = c
                continue
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] = new_words.get(tuple(out), 0) + c
        words = new_words
    return alphabet, merges


def build_tokenizer_json() -> dict:
    vocab = {}
    n_unused = 0
    for i in range(N_ADDED):
        if i in SPECIAL_NAMES:
            vocab[SPECIAL_NAMES[i]] = i
        else:
            vocab[f"<unused{n_unused}>"] = i
            n_unused += 1
    for b in range(256):
        vocab[byte_token(b)] = BYTE_BASE + b
    base = len(vocab)
    assert base == 365
    # First pass to size the alphabet, then learn exactly enough merges for TARGET_VOCAB.
    alphabet, _ = train_bpe(CORPUS, 0)
    alphabet = [ch for ch in alphabet if ch not in vocab]
    _, merges = train_bpe(CORPUS, TARGET_VOCAB - base - len(alphabet))
    for ch in alphabet:
        vocab[ch] = len(vocab)
    kept = []
    for a, b in merges:
        tok = a + b
        if tok in vocab:  # cannot happen with this trainer, but keep the file valid
            continue
        vocab[tok] = len(vocab)
        kept.append([a, b])
    id_to_tok = {i: t for t, i in vocab.items()}
    added = []
    for i in range(N_ADDED):
        added.append(
            {
                "id": i,
                "content": id_to_tok[i],
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": i in SPECIAL_TRUE,
            }
        )
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "pre_tokenizer": {
            "type": "Split",
            "pattern": {"String": " "},
            "behavior": "MergedWithPrevious",
            "invert": False,
        },
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": "<bos>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": "<bos>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "<bos>", "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}},
        },
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": kept,
        },
    }


# frigg's own chat template for the HRM-Text / Gemma-4 "native" turn format (see
# tests/fixtures/README.md). Written to need only what minijinja (+ pycompat) offers:
# macros (recursive), namespace, dictsort, upper, trim, is mapping/string/sequence/boolean/none.
CHAT_TEMPLATE = r"""{#- frigg chat template: HRM-Text / Gemma-4 native turn format -#}
{%- macro render_value(v) -%}
    {%- if v is none -%}null
    {%- elif v is boolean -%}{{ 'true' if v else 'false' }}
    {%- elif v is string -%}<|"|>{{ v }}<|"|>
    {%- elif v is mapping -%}
        {{- '{' -}}
        {%- for k, x in v | dictsort -%}
            {{- k }}:{{ render_value(x) }}{{ ',' if not loop.last else '' -}}
        {%- endfor -%}
        {{- '}' -}}
    {%- elif v is sequence -%}
        {{- '[' -}}
        {%- for x in v -%}
            {{- render_value(x) }}{{ ',' if not loop.last else '' -}}
        {%- endfor -%}
        {{- ']' -}}
    {%- else -%}{{ v }}
    {%- endif -%}
{%- endmacro -%}
{%- macro render_type(t) -%}
    {%- if t is string -%}<|"|>{{ t | upper }}<|"|>
    {%- else -%}
        {{- '[' -}}
        {%- for x in t -%}<|"|>{{ x | upper }}<|"|>{{ ',' if not loop.last else '' }}{%- endfor -%}
        {{- ']' -}}
    {%- endif -%}
{%- endmacro -%}
{%- macro render_required(req) -%}
    required:[
    {%- for r in req -%}<|"|>{{ r }}<|"|>{{ ',' if not loop.last else '' }}{%- endfor -%}
    ]
{%- endmacro -%}
{%- macro render_schema(s) -%}
    {%- set ns = namespace(sep='') -%}
    {%- if s['description'] -%}
        description:<|"|>{{ s['description'] }}<|"|>
        {%- set ns.sep = ',' -%}
    {%- endif -%}
    {%- if s['enum'] -%}
        {{- ns.sep }}enum:{{ render_value(s['enum']) }}
        {%- set ns.sep = ',' -%}
    {%- endif -%}
    {%- if s['items'] is mapping -%}
        {{- ns.sep }}items:{{ '{' }}{{ render_schema(s['items']) }}{{ '}' }}
        {%- set ns.sep = ',' -%}
    {%- endif -%}
    {%- if s['nullable'] -%}
        {{- ns.sep }}nullable:true
        {%- set ns.sep = ',' -%}
    {%- endif -%}
    {%- if s['properties'] is mapping and s['properties'] -%}
        {{- ns.sep }}properties:{{ '{' }}
        {%- for name, p in s['properties'] | dictsort -%}
            {{- name }}:{{ '{' }}{{ render_schema(p) }}{{ '}' }}{{ ',' if not loop.last else '' -}}
        {%- endfor -%}
        {{- '}' -}}
        {%- set ns.sep = ',' -%}
    {%- endif -%}
    {%- if s['required'] -%}
        {{- ns.sep }}{{ render_required(s['required']) }}
        {%- set ns.sep = ',' -%}
    {%- endif -%}
    {%- if s['type'] -%}
        {{- ns.sep }}type:{{ render_type(s['type']) }}
    {%- endif -%}
{%- endmacro -%}
{%- macro render_text(content) -%}
    {%- if content is string -%}{{ content | trim }}
    {%- elif content is sequence -%}
        {%- for part in content -%}
            {%- if part['type'] == 'text' -%}{{ part['text'] | trim }}{%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- set msgs = messages -%}
{%- set has_system = messages | length > 0 and messages[0]['role'] in ['system', 'developer'] -%}
{%- if has_system or tools -%}
    {{- '<|turn>system\n' -}}
    {%- if has_system -%}
        {{- render_text(messages[0]['content']) -}}
        {%- set msgs = messages[1:] -%}
    {%- endif -%}
    {%- for tool in tools or [] -%}
        {%- set f = tool['function'] if tool['function'] is mapping else tool -%}
        <|tool>declaration:{{ f['name'] }}{{ '{' }}description:<|"|>{{ f['description'] }}<|"|>
        {%- if f['parameters'] is mapping and f['parameters'] -%}
            ,parameters:{{ '{' }}{{ render_schema(f['parameters']) }}{{ '}' }}
        {%- endif -%}
        {{ '}' }}<tool|>
    {%- endfor -%}
    {{- '<turn|>\n' -}}
{%- endif -%}
{%- set st = namespace(open=false, calls=[]) -%}
{%- for m in msgs -%}
    {%- set next_role = '' if loop.last else msgs[loop.index0 + 1]['role'] -%}
    {%- if m['role'] == 'tool' -%}
        {%- set tn = namespace(name='unknown') -%}
        {%- if m['name'] -%}{%- set tn.name = m['name'] -%}{%- endif -%}
        {%- for c in st.calls -%}
            {%- if m['tool_call_id'] and c['id'] == m['tool_call_id'] -%}
                {%- set tn.name = c['function']['name'] -%}
            {%- endif -%}
        {%- endfor -%}
        <|tool_response>response:{{ tn.name }}{{ '{' }}
        {%- if m['content'] is mapping -%}
            {%- for k, x in m['content'] | dictsort -%}
                {{- k }}:{{ render_value(x) }}{{ ',' if not loop.last else '' -}}
            {%- endfor -%}
        {%- else -%}
            value:<|"|>{{ render_text(m['content']) }}<|"|>
        {%- endif -%}
        {{ '}' }}<tool_response|>
        {%- set st.open = true -%}
        {%- if next_role != '' and next_role != 'tool' and next_role != 'assistant' -%}
            {{- '<turn|>\n' -}}
            {%- set st.open = false -%}
        {%- endif -%}
    {%- else -%}
        {%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}
        {%- if not (role == 'model' and st.open) -%}
            {{- '<|turn>' ~ role ~ '\n' -}}
        {%- endif -%}
        {{- render_text(m['content']) -}}
        {%- if m['tool_calls'] -%}
            {%- for c in m['tool_calls'] -%}
                {%- set fn = c['function'] -%}
                <|tool_call>call:{{ fn['name'] }}{{ '{' }}
                {%- if fn['arguments'] is mapping -%}
                    {%- for k, x in fn['arguments'] | dictsort -%}
                        {{- k }}:{{ render_value(x) }}{{ ',' if not loop.last else '' -}}
                    {%- endfor -%}
                {%- else -%}{{ fn['arguments'] }}
                {%- endif -%}
                {{ '}' }}<tool_call|>
            {%- endfor -%}
            {%- set st.calls = m['tool_calls'] -%}
            {%- if next_role == 'tool' -%}
                {%- set st.open = true -%}
            {%- elif next_role == '' -%}
                {{- '<|tool_response>' -}}
                {%- set st.open = true -%}
            {%- else -%}
                {{- '<turn|>\n' -}}
                {%- set st.open = false -%}
            {%- endif -%}
        {%- else -%}
            {{- '<turn|>\n' -}}
            {%- set st.open = false -%}
        {%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt and not st.open -%}
    {{- '<|turn>model\n' -}}
{%- endif -%}
"""

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a location.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City name, e.g. Aarhus"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "description": "Number of days"},
            },
            "required": ["location"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}, "nullable": True},
            },
            "required": ["query"],
        },
    },
}

CHAT_CASES = [
    {
        "id": "user_only",
        "messages": [{"role": "user", "content": "Hej! Hvordan har du det i dag?"}],
        "tools": None,
        "add_generation_prompt": True,
    },
    {
        "id": "system_multiturn",
        "messages": [
            {"role": "system", "content": "  Du er en hjælpsom assistent. Svar kort.  "},
            {"role": "user", "content": "Hvad er 2 + 2?"},
            {"role": "assistant", "content": "Svaret er 4."},
            {"role": "user", "content": "And in English?\n\nThanks."},
        ],
        "tools": None,
        "add_generation_prompt": True,
    },
    {
        "id": "no_generation_prompt",
        "messages": [
            {"role": "user", "content": "What time is it?"},
            {"role": "assistant", "content": "It is a quarter past seven."},
        ],
        "tools": None,
        "add_generation_prompt": False,
    },
    {
        "id": "tools_declared",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Hvordan er vejret i Aarhus?"},
        ],
        "tools": [WEATHER_TOOL, SEARCH_TOOL],
        "add_generation_prompt": True,
    },
    {
        "id": "tool_call_and_response",
        "messages": [
            {"role": "user", "content": "What is the weather in Odense, in celsius, for 3 days?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "arguments": {"location": "Odense", "unit": "celsius", "days": 3, "verbose": True},
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "21,5 grader og sol"},
            {"role": "assistant", "content": "Det er 21,5 grader og solskin i Odense."},
            {"role": "user", "content": "Tak!"},
        ],
        "tools": [WEATHER_TOOL],
        "add_generation_prompt": True,
    },
    {
        "id": "tool_response_pending_generation",
        "messages": [
            {"role": "user", "content": "Search for fjord hygge."},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "c9",
                        "type": "function",
                        "function": {"name": "search", "arguments": {"query": "fjord hygge", "tags": ["dk", "travel"]}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c9", "content": {"hits": 2, "top": "Vejle Fjord"}},
        ],
        "tools": [SEARCH_TOOL],
        "add_generation_prompt": True,
    },
]

PROBES = [
    "Hello, world!",
    "Hej verden! Hvordan går det?",
    "æøå ÆØÅ Æblet på øen",
    "Det koster 125,50 kr. (inkl. moms)",
    "3.14159 + 2 = 5.14159",
    "two  spaces and   three",
    " leading space",
    "trailing space ",
    "line one\nline two\n\nparagraph\n\n\nthree newlines",
    "<|turn>user\nHej<turn|>\n<|turn>model\n",
    '<|tool_call>call:get_weather{location:<|"|>Aarhus<|"|>}<tool_call|>',
    "<bos><eos><pad> are special, <mask> and <unused3> are not",
    "naïve café façade jalapeño über",
    "emoji 😀 and CJK 漢字 fall back to bytes",
    "tab\there\r\nCRLF",
]


def render_template(template_text: str, case: dict, bos: str) -> str:
    import jinja2

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    tmpl = env.from_string(template_text)
    return tmpl.render(
        messages=case["messages"],
        tools=case["tools"],
        add_generation_prompt=case["add_generation_prompt"],
        bos_token=bos,
        eos_token="<eos>",
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "tokenizer"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from tokenizers import Tokenizer

    tj = build_tokenizer_json()
    text = json.dumps(tj, ensure_ascii=False, indent=2) + "\n"
    (out / "tokenizer.json").write_text(text, encoding="utf-8")
    tok = Tokenizer.from_str(text)
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    print(f"tokenizer.json: vocab {vocab_size}, merges {len(tj['model']['merges'])}", file=sys.stderr)
    # sanity: ids of the specials
    for i, name in SPECIAL_NAMES.items():
        assert tok.token_to_id(name) == i, (name, tok.token_to_id(name), i)
    for b in range(256):
        assert tok.token_to_id(byte_token(b)) == BYTE_BASE + b

    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    cfg = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": "<bos>",
        "eos_token": "<turn|>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "clean_up_tokenization_spaces": False,
        "fix_mistral_regex": True,
        "model_max_length": 1000000000000000019884624838656,
        "padding_side": "left",
        "tokenizer_class": "TokenizersBackend",
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")

    cases = []
    for case in CHAT_CASES:
        rendered = render_template(CHAT_TEMPLATE, case, "<bos>")
        ids = tok.encode(rendered, add_special_tokens=False).ids
        assert tok.decode(ids, skip_special_tokens=False) == rendered, case["id"]
        cases.append(
            {
                "id": case["id"],
                "messages": case["messages"],
                "tools": case["tools"],
                "add_generation_prompt": case["add_generation_prompt"],
                "bos_token": "<bos>",
                "text": rendered,
                "ids": ids,
            }
        )
    (out / "chat_cases.json").write_text(json.dumps(cases, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")

    probes = []
    for s in PROBES:
        enc = tok.encode(s, add_special_tokens=False)
        with_bos = tok.encode(s, add_special_tokens=True).ids
        assert with_bos == [2] + enc.ids
        probes.append(
            {
                "text": s,
                "ids": enc.ids,
                "tokens": enc.tokens,
                "decoded": tok.decode(enc.ids, skip_special_tokens=False),
            }
        )
    (out / "probes.json").write_text(json.dumps(probes, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
