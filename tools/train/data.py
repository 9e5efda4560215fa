# Builds the demo model's training / held-out data: King James Bible text (decoded from the Debian
# bible-kjv-text package with its `bible` program) and synthetic chat conversations rendered with the real
# MiniMax-M3 chat template (reasoning in <mm:think>, M3-format tool calls on three deterministic tools).
import json
import os
import random
import re
import subprocess
import zlib

import jinja2

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.path.join(HERE, "work")
TEMPLATE = os.path.join(HERE, "chat_template.jinja")


# ----------------------------------------------------------------------------------------------- KJV
def load_kjv():
    """Returns [(book, chapter, verse, text)] in canonical order."""
    out = subprocess.run(["bible", "-l100000", "Gen1:1-Rev22:21"], check=True, capture_output=True,
                         text=True).stdout
    verses, book, chap = [], None, None
    for line in out.split("\n"):
        if not line.strip():
            continue
        if not line.startswith(" "):
            m = re.match(r"^(.*\S)\s+(\d+)$", line.strip())
            book, chap = m.group(1), int(m.group(2))
            continue
        m = re.match(r"^\s*(\d+)\s+(.*)$", line)
        verses.append((book, chap, int(m.group(1)), m.group(2).strip()))
    return verses


def held_out(key, mod=10):
    """Deterministic held-out split: about 1/mod of keys are held out."""
    return zlib.crc32(key.encode()) % mod == 0


# --------------------------------------------------------------------------------------------- tools
TOOL_CALC = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {
        "expression": {"type": "string", "description": "for example 12 * 7"}}, "required": ["expression"]}}}
TOOL_VERSE = {"type": "function", "function": {
    "name": "verse_lookup", "description": "Look up a verse of the King James Bible.",
    "parameters": {"type": "object", "properties": {
        "book": {"type": "string"}, "chapter": {"type": "integer"}, "verse": {"type": "integer"}},
        "required": ["book", "chapter", "verse"]}}}
TOOL_UNITS = {"type": "function", "function": {
    "name": "convert_units", "description": "Convert a value from one unit to another.",
    "parameters": {"type": "object", "properties": {
        "value": {"type": "number"}, "from_unit": {"type": "string"}, "to_unit": {"type": "string"}},
        "required": ["value", "from_unit", "to_unit"]}}}
ALL_TOOLS = [TOOL_CALC, TOOL_VERSE, TOOL_UNITS]

UNITS = {  # (from, to): (factor, offset), to = from * factor + offset
    ("km", "mile"): (0.621371, 0), ("mile", "km"): (1.609344, 0),
    ("kg", "pound"): (2.204623, 0), ("pound", "kg"): (0.453592, 0),
    ("meter", "foot"): (3.280840, 0), ("foot", "meter"): (0.3048, 0),
    ("liter", "gallon"): (0.264172, 0), ("gallon", "liter"): (3.785412, 0),
    ("inch", "cm"): (2.54, 0), ("cm", "inch"): (0.393701, 0),
    ("celsius", "fahrenheit"): (1.8, 32), ("fahrenheit", "celsius"): (5 / 9, -160 / 9),
}
UNIT_WORDS = {"km": "kilometers", "mile": "miles", "kg": "kilograms", "pound": "pounds", "meter": "meters",
              "foot": "feet", "liter": "liters", "gallon": "gallons", "inch": "inches", "cm": "centimeters",
              "celsius": "degrees Celsius", "fahrenheit": "degrees Fahrenheit"}
OPS = {"+": ("add", "plus", "sum"), "-": ("subtract", "minus", "difference"),
       "*": ("multiply", "times", "product"), "/": ("divide", "divided by", "quotient")}


def fmt_num(x):
    if abs(x - round(x)) < 1e-9:
        return str(int(round(x)))
    return ("%.3f" % x).rstrip("0").rstrip(".")


def calc(expr):
    a, op, b = expr.split(" ")
    a, b = int(a), int(b)
    return fmt_num({"+": a + b, "-": a - b, "*": a * b, "/": a / b}[op])


def convert(value, f, t):
    k, o = UNITS[(f, t)]
    return fmt_num(value * k + o)


# ------------------------------------------------------------------------------------- task samplers
def task_calc(rng, split):
    while True:
        op = rng.choice("+-*/")
        a = rng.randint(2, 999) if op in "+-" else rng.randint(2, 99)
        b = rng.randint(2, 999) if op in "+-" else rng.randint(2, 99)
        if op == "/":
            a = a * b if rng.random() < 0.7 else a
        expr = "%d %s %d" % (a, op, b)
        if held_out("calc" + expr) == (split == "eval"):
            break
    verb, word, noun = OPS[op]
    user = rng.choice([
        "What is %s?" % expr, "Compute %s." % expr, "Please calculate %s for me." % expr,
        "Can you work out %s?" % expr, "What is %d %s %d?" % (a, word, b),
        "I need the %s of %d and %d." % (noun, a, b) if op in "+*" else "What is %d %s %d?" % (a, word, b)])
    res = calc(expr)
    return dict(kind="calc", user=user, calls=[("calculator", {"expression": expr})], results=[res],
                think1="The user wants to %s %d and %d. I will use the calculator tool with the expression %s." % (
                    verb, a, b, expr),
                think2="The calculator returned %s, so %s = %s." % (res, expr, res),
                answer=rng.choice(["%s = %s." % (expr, res), "The answer is %s." % res,
                                   "%s equals %s." % (expr, res)]))


def task_verse(rng, split, verses):
    while True:
        book, ch, vs, text = rng.choice(verses)
        ref = "%s %d:%d" % (book, ch, vs)
        if held_out("verse" + ref) == (split == "eval"):
            break
    user = rng.choice(["Look up %s." % ref, "What does %s say?" % ref, "Please quote %s." % ref,
                       "Can you find the verse %s?" % ref, "Show me %s from the King James Bible." % ref])
    return dict(kind="verse", user=user, calls=[("verse_lookup", {"book": book, "chapter": ch, "verse": vs})],
                results=[text],
                think1="The user asks for %s. I will look it up with verse_lookup: book %s, chapter %d, verse %d." % (
                    ref, book, ch, vs),
                think2="The lookup returned the text of %s. I will quote it." % ref,
                answer=rng.choice(['%s says: "%s"' % (ref, text), '%s reads: "%s"' % (ref, text)]))


def task_units(rng, split):
    while True:
        f, t = rng.choice(sorted(UNITS))
        value = rng.choice([rng.randint(1, 500), round(rng.uniform(0.5, 100), 1)])
        key = "units%s%s%s" % (value, f, t)
        if held_out(key) == (split == "eval"):
            break
    vs = fmt_num(value)
    user = rng.choice(["Convert %s %s to %s." % (vs, UNIT_WORDS[f], UNIT_WORDS[t]),
                       "How many %s is %s %s?" % (UNIT_WORDS[t], vs, UNIT_WORDS[f]),
                       "What is %s %s in %s?" % (vs, UNIT_WORDS[f], UNIT_WORDS[t])])
    res = convert(float(value), f, t)
    return dict(kind="units", user=user,
                calls=[("convert_units", {"value": value, "from_unit": f, "to_unit": t})], results=[res],
                think1="The user wants to convert %s %s to %s. I will call convert_units with from_unit %s and to_unit %s." % (
                    vs, UNIT_WORDS[f], UNIT_WORDS[t], f, t),
                think2="The converter returned %s." % res,
                answer="%s %s is about %s %s." % (vs, UNIT_WORDS[f], res, UNIT_WORDS[t]))


def task_two_calls(rng, split, verses):
    a, b = task_calc(rng, split), task_units(rng, split)
    if rng.random() < 0.5:
        a, b = b, a
    return dict(kind="multi", user=a["user"] + " Also, " + b["user"][0].lower() + b["user"][1:],
                calls=a["calls"] + b["calls"], results=a["results"] + b["results"],
                think1="There are two requests. " + a["think1"] + " " + b["think1"] + " I can make both calls at once.",
                think2=a["think2"] + " " + b["think2"], answer=a["answer"] + " " + b["answer"])


def chat_plain(rng, verses):
    """No-tool turns: (user, reasoning, answer)."""
    r = rng.random()
    if r < 0.3:
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        op = rng.choice("+-*")
        res = {"+": a + b, "-": a - b, "*": a * b}[op]
        return ("What is %d %s %d?" % (a, op, b),
                "This is simple arithmetic: %d %s %d = %d. No tool is needed." % (a, op, b, res),
                "%d %s %d = %d." % (a, op, b, res))
    if r < 0.55:
        i = rng.randrange(len(verses) - 3)
        book, ch, vs, _ = verses[i]
        n = rng.randint(1, 3)
        text = " ".join(v[3] for v in verses[i:i + n] if v[0] == book and v[1] == ch)
        return ("Recite %s %d:%d%s." % (book, ch, vs, "" if n == 1 else "-%d" % (vs + n - 1)),
                "The user wants the text of %s %d:%d. I know this passage." % (book, ch, vs), text)
    if r < 0.7:
        return (rng.choice(["Hello!", "Hi there.", "Good morning!", "Hello, who are you?"]),
                "The user is greeting me. I should greet them back and offer help.",
                rng.choice(["Hello! How can I help you today?",
                            "Hello! I am a small demo model served by m3serve. I can do arithmetic, look up Bible verses and convert units.",
                            "Hi! What can I do for you?"]))
    if r < 0.8:
        return (rng.choice(["Who are you?", "What can you do?", "Tell me about yourself."]),
                "The user asks about me. I should describe what I can do.",
                "I am a small demo model of the MiniMax-M3.1 architecture, served by m3serve. I was trained on the King James Bible and on simple tool-use conversations, so I can quote scripture, do arithmetic with a calculator, look up verses and convert units.")
    book = rng.choice(["Genesis", "Psalms", "Proverbs", "Isaiah", "Matthew", "John", "Romans", "Revelation"])
    i = rng.choice([k for k, v in enumerate(verses[:-4]) if v[0] == book and v[2] == 1])
    text = " ".join(v[3] for v in verses[i:i + 3])
    return ("Tell me something from the book of %s." % book,
            "The user wants a passage from %s. I will quote the opening of chapter %d." % (book, verses[i][1]),
            "From %s %d: %s" % (book, verses[i][1], text))


DEVELOPER = [None, None, "You are a helpful assistant.", "You are a helpful assistant. Answer briefly.",
             "You are a Bible study assistant.", "You are a careful assistant that uses tools when they help."]
MODES = ["enabled", "disabled", "adaptive", None]


def make_env():
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = lambda v, ensure_ascii=False, indent=None: json.dumps(
        v, ensure_ascii=ensure_ascii, indent=indent)
    return env.from_string(open(TEMPLATE).read())


def render(tmpl, messages, tools=None, mode=None, gen=False):
    kw = dict(messages=messages, add_generation_prompt=gen)
    if tools:
        kw["tools"] = tools
    if mode is not None:
        kw["thinking_mode"] = mode
    return tmpl.render(**kw)


def thinks(rng, mode, p_adaptive):
    if mode == "enabled":
        return True
    if mode == "disabled":
        return False
    return rng.random() < p_adaptive


def tool_task(rng, split, verses):
    r = rng.random()
    if r < 0.33:
        return task_calc(rng, split)
    if r < 0.66:
        return task_verse(rng, split, verses)
    if r < 0.92:
        return task_units(rng, split)
    return task_two_calls(rng, split, verses)


def pick_tools(rng, task):
    need = {c[0] for c in task["calls"]}
    tools = [t for t in ALL_TOOLS if t["function"]["name"] in need or rng.random() < 0.6]
    rng.shuffle(tools)
    return tools


def tool_turn(rng, mode, task):
    """The assistant's side of one tool task: the call (with reasoning by the mode), the tool results and
    the final answer (with reasoning by the mode)."""
    call_msg = {"role": "assistant", "content": "",
                "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}}
                               for n, a in task["calls"]]}
    if thinks(rng, mode, 0.7):
        call_msg["reasoning_content"] = task["think1"]
    fin = {"role": "assistant", "content": task["answer"]}
    results = [{"role": "tool", "content": res} for res in task["results"]]
    if thinks(rng, mode, 0.5):
        fin["reasoning_content"] = task["think2"]
    return [call_msg] + results + [fin]


def conversation(rng, tmpl, verses, split="train"):
    """One rendered training conversation (full text, no generation prompt)."""
    mode = rng.choice(MODES)
    dev = rng.choice(DEVELOPER)
    msgs = [{"role": "system", "content": dev}] if dev else []
    tools = None
    if rng.random() < 0.6:
        task = tool_task(rng, split, verses)
        tools = pick_tools(rng, task)
        if rng.random() < 0.2:  # an earlier plain exchange first
            u, th, a = chat_plain(rng, verses)
            msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        msgs.append({"role": "user", "content": task["user"]})
        msgs += tool_turn(rng, mode, task)
    else:
        if rng.random() < 0.3:
            tools = [t for t in ALL_TOOLS if rng.random() < 0.5] or None
        for _ in range(1 if rng.random() < 0.75 else 2):
            u, th, a = chat_plain(rng, verses)
            m = {"role": "assistant", "content": a}
            if thinks(rng, mode, 0.4):
                m["reasoning_content"] = th
            msgs += [{"role": "user", "content": u}, m]
    return render(tmpl, msgs, tools, mode)


def chat_social(rng):
    """A no-tool exchange that cannot be mistaken for a tool task (greeting / identity)."""
    if rng.random() < 0.15:
        return (rng.choice(["Thanks!", "Thank you."]), "The user thanks me. I should reply politely.",
                "You are welcome! Anything else?")
    if rng.random() < 0.6:
        return (rng.choice(["Hello!", "Hi there.", "Good morning!", "Hello, who are you?"]),
                "The user is greeting me. I should greet them back and offer help.",
                rng.choice(["Hello! How can I help you today?", "Hi! What can I do for you?"]))
    return (rng.choice(["Who are you?", "What can you do?", "Tell me about yourself."]),
            "The user asks about me. I should describe what I can do.",
            "I am a small demo model of the MiniMax-M3.1 architecture, served by m3serve. I can quote scripture, do arithmetic with a calculator, look up verses and convert units.")


def tool_session(rng, tmpl, verses, split="train"):
    """Stage 3: one fixed prefix (system + tools), then several tool tasks, each a new user turn with its
    call, tool responses and final answer, so most tokens after the ~450-token prefix teach tool use.
    Every task whose tool is given is answered with a call; ~1 in 4 sessions is a single task (the
    evaluation's shape)."""
    mode = rng.choice(MODES)
    dev = rng.choice(DEVELOPER)
    msgs = [{"role": "system", "content": dev}] if dev else []
    k = 1 if rng.random() < 0.25 else rng.randint(3, 7)
    tasks = [tool_task(rng, split, verses) for _ in range(k)]
    need = {c[0] for t in tasks for c in t["calls"]}
    tools = [t for t in ALL_TOOLS if t["function"]["name"] in need or rng.random() < 0.6]
    rng.shuffle(tools)
    for i, task in enumerate(tasks):
        if rng.random() < (0.1 if i == 0 else 0.08):
            u, th, a = chat_social(rng)
            m = {"role": "assistant", "content": a}
            if thinks(rng, mode, 0.4):
                m["reasoning_content"] = th
            msgs += [{"role": "user", "content": u}, m]
        msgs.append({"role": "user", "content": task["user"]})
        msgs += tool_turn(rng, mode, task)
    return render(tmpl, msgs, tools, mode)


def main_stage3(n):
    """work/train3.json and work/train3_conv_{ids,offs}.npy (encoded with the existing tokenizer)."""
    import numpy as np
    from bpe import Tokenizer, encode_docs
    rng = random.Random(5678)
    tmpl = make_env()
    verses = load_kjv()
    sessions = [tool_session(rng, tmpl, verses) for _ in range(n)]
    json.dump(dict(conv=sessions), open(os.path.join(WORK, "train3.json"), "w"))
    tok = Tokenizer(os.path.join(HERE, "..", "..", "models", "demo", "tokenizer.json"))
    ids, offs = encode_docs(tok, sessions)
    np.save(os.path.join(WORK, "train3_conv_ids.npy"), ids)
    np.save(os.path.join(WORK, "train3_conv_offs.npy"), offs)
    print("stage-3 tool sessions %d, %d tokens (%.0f per session)" % (n, len(ids), len(ids) / n))


def eval_tasks(rng, tmpl, verses, n):
    """Held-out tool tasks: the prompt (with generation prefix) and the expected calls."""
    out = []
    for i in range(n):
        mode = MODES[i % 4]
        task = tool_task(rng, "eval", verses)
        tools = pick_tools(rng, task)
        dev = rng.choice(DEVELOPER)
        msgs = ([{"role": "system", "content": dev}] if dev else []) + [{"role": "user", "content": task["user"]}]
        out.append(dict(prompt=render(tmpl, msgs, tools, mode, gen=True), mode=mode, messages=msgs,
                        tool_defs=tools, tools=[t["function"]["name"] for t in tools],
                        calls=[{"name": n, "arguments": a} for n, a in task["calls"]]))
    return out


def main():
    os.makedirs(WORK, exist_ok=True)
    rng = random.Random(1234)
    tmpl = make_env()
    verses = load_kjv()
    # KJV: whole chapters; about 1 in 25 chapters is held out for perplexity.
    chapters = {}
    for b, c, v, t in verses:
        chapters.setdefault((b, c), []).append("%s %d:%d %s" % (b, c, v, t))
    kjv_train, kjv_eval = [], []
    for (b, c), lines in chapters.items():
        (kjv_eval if held_out("chap%s%d" % (b, c), 25) else kjv_train).append("\n".join(lines) + "\n")
    n_conv = int(os.environ.get("DEMO_CONVERSATIONS", "8000"))
    convs = [conversation(rng, tmpl, verses) for _ in range(n_conv)]
    erng = random.Random(777)
    convs_eval = [conversation(erng, tmpl, verses, "eval") for _ in range(200)]
    tasks = eval_tasks(random.Random(4321), tmpl, verses, 200)
    json.dump(dict(kjv=kjv_train, conv=convs), open(os.path.join(WORK, "train.json"), "w"))
    json.dump(dict(kjv=kjv_eval, conv=convs_eval), open(os.path.join(WORK, "heldout.json"), "w"))
    with open(os.path.join(WORK, "eval_tasks.jsonl"), "w") as f:
        for t in tasks:
            f.write(json.dumps(t) + "\n")
    print("verses %d, kjv chapters train %d eval %d, conversations %d (%.1f MB), eval tasks %d" % (
        len(verses), len(kjv_train), len(kjv_eval), len(convs), sum(map(len, convs)) / 1e6, len(tasks)))


if __name__ == "__main__":
    import sys
    if len(sys.argv) > 1 and sys.argv[1] == "stage3":
        main_stage3(int(sys.argv[2]) if len(sys.argv) > 2 else 6000)
    else:
        main()
