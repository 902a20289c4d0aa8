"""Chat templates (refimpl.tokenizers.chat) against transformers, the sandbox, and generate --chat.

- render_chat equals transformers' rendering (render_jinja_template, what apply_chat_template(...,
  tokenize=False) calls with the tokenizer's special tokens) on 20 conversations for SmolLM2's
  template (from its GGUF) and two templates written here in the style of Gemma's and Llama 3's
  (bos_token, raise_exception, namespace, tojson, strftime_now, loop controls, trim/lstrip).
- templates that reach for Python internals raise ChatTemplateError and run nothing.
- an HF-folder LLaMA with tokenizer.json + tokenizer_config.json chat_template: chat_prompt's ids
  equal apply_chat_template(..., tokenize=True), and `generate --chat` generates from them.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from refimpl.tokenizers.chat import ChatTemplateError, read_chat_template, render_chat
from tokenizer_oracles import CACHE

SMOL = CACHE / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"

GEMMA_STYLE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {{- message['content'] | trim }}
    {{- '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\n' }}
{%- endif -%}
"""

LLAMA3_STYLE = """{{- bos_token }}
{%- set ns = namespace(system='', turns=0) %}
{%- if messages[0]['role'] == 'system' %}
    {%- set ns.system = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- endif %}
<|start_header_id|>system<|end_header_id|>

Today: {{ strftime_now("%Y") }} {{ {"tools": tools, "n": messages | length} | tojson }}
{{ ns.system }}<|eot_id|>
{% for message in messages %}
    {% if message['content'] == 'skip me' %}{% continue %}{% endif %}
    {% set ns.turns = ns.turns + 1 %}
<|start_header_id|>{{ message['role'] }}<|end_header_id|>

{{ message['content'] | trim }}<|eot_id|>
{% endfor %}
{% if add_generation_prompt %}
<|start_header_id|>assistant<|end_header_id|>

{% endif %}
"""


def conversations() -> list[list[dict]]:
    """20 conversations: with and without a system message, one to five turns, Unicode, whitespace, JSON-ish text,
    ending with a user or an assistant message, two with two user messages in a row."""
    users = ["Hi!", "What is 2 + 2?", "Écris un poème 🐍 sur\nPython.", "  spaces around  ",
             "<b>tags</b> & \"quotes\"",
             "skip me", "中文问题？", "tabs\tand\nnewlines\n"]
    replies = ["Hello.", "4", "Le serpent…", "ok", "{\"a\": [1, 2]}"]
    out = []
    for k in range(20):
        chat = [{"role": "system", "content": f"You are assistant number {k}."}] if k % 2 == 0 else []
        for turn in range(1 + k % 3):
            chat.append({"role": "user", "content": users[(k + turn) % len(users)]})
            if turn < k % 3:
                chat.append({"role": "assistant", "content": replies[(k + turn) % len(replies)]})
        if k % 5 == 4:
            chat.append({"role": "assistant", "content": replies[k % len(replies)]})
        if k % 7 == 6:  # two user messages in a row: the Gemma-style template refuses it
            chat.append({"role": "user", "content": "again?"})
        out.append(chat)
    return out


@pytest.fixture(scope="module")
def smol_template() -> str:
    from refimpl.gguf import read_gguf
    from refimpl.tokenizers.gguf import chat_template_from_gguf

    return chat_template_from_gguf(read_gguf(SMOL).metadata)


@pytest.mark.parametrize("name", ["smollm2", "gemma-style", "llama3-style"])
def test_render_chat_equals_transformers(name, smol_template):
    from transformers.utils.chat_template_utils import render_jinja_template

    template = {"smollm2": smol_template, "gemma-style": GEMMA_STYLE, "llama3-style": LLAMA3_STYLE}[name]
    special = {"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>"}
    rendered = 0
    for k, chat in enumerate(conversations()):
        for generation in (True, False):
            try:
                (theirs,), _ = render_jinja_template(conversations=[chat], chat_template=template,
                                                     add_generation_prompt=generation, **special)
            except Exception as e:  # the template refuses this conversation: so must ours, with the same message
                with pytest.raises(ChatTemplateError) as ours:
                    render_chat(template, chat, add_generation_prompt=generation, **special)
                assert str(e) in str(ours.value)
                continue
            assert render_chat(template, chat, add_generation_prompt=generation, **special) == theirs, (k, generation)
            rendered += 1
    print(f"\n{name}: {rendered} of 40 renderings equal transformers' (the rest refused by both)")
    assert rendered >= 30


def test_render_chat_with_a_real_tokenizer_apply_chat_template(smol_template):
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), bos_token="<s>", eos_token="</s>")
    for chat in conversations()[:6]:
        for template in (smol_template, GEMMA_STYLE):
            theirs = hf.apply_chat_template(chat, chat_template=template, tokenize=False, add_generation_prompt=True)
            assert render_chat(template, chat, bos_token="<s>", eos_token="</s>") == theirs


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ raise_exception.__globals__['os'].system('touch {marker}') }}",
    "{{ cycler.__init__.__globals__.os.popen('touch {marker}').read() }}",
    "{{ messages.__class__ }}",
    "{% set x = messages.append({'role': 'user'}) %}",
    "{% set ns = namespace(__class__=1) %}",
    "{{ namespace().__init__.__globals__ }}",
    "{% for c in ().__class__.__base__.__subclasses__() %}{{ c }}{% endfor %}",
    "{{ lipsum.__globals__['os'].popen('touch {marker}') }}",
    "{{ dict.__call__.__globals__ }}",
])
def test_malicious_templates_are_refused_by_the_sandbox(template, tmp_path):
    marker = tmp_path / "pwned"
    template = template.replace("{marker}", str(marker))
    with pytest.raises(ChatTemplateError) as e:
        render_chat(template, [{"role": "user", "content": "hi"}], source="evil.gguf: tokenizer.chat_template")
    assert str(e.value).startswith("evil.gguf: tokenizer.chat_template: ")
    assert not marker.exists()


def test_template_errors_name_the_source():
    chat = [{"role": "user", "content": "hi"}]
    with pytest.raises(ChatTemplateError, match=r"^m/tokenizer_config.json: the chat template does not compile"):
        render_chat("{% for m in messages %}{{ m }", chat, source="m/tokenizer_config.json")
    with pytest.raises(ChatTemplateError, match=r"^chat template: TemplateError: no system message allowed$"):
        render_chat("{{ raise_exception('no system message allowed') }}", chat)
    with pytest.raises(ChatTemplateError, match="TypeError"):
        render_chat("{{ messages[0]['content'] + 1 }}", chat)
    with pytest.raises(TypeError, match=r"messages\[0\]"):
        render_chat("x", [{"content": "no role"}])
    with pytest.raises(TypeError, match="plain data"):
        render_chat("x", [{"role": "user", "content": object()}])
    assert render_chat("{{ messages[0]['n'] + 1 }}", [{"role": "user", "n": np.int64(2), "gone": None}]) == "3"
    assert render_chat("{{ messages[0] | tojson }}", [{"role": "é", "c": None}]) == '{"role": "é"}'


def test_read_chat_template_from_a_folder(tmp_path):
    assert read_chat_template(tmp_path) is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}))
    assert read_chat_template(tmp_path) == "D"
    (tmp_path / "chat_template.jinja").write_text("J")
    assert read_chat_template(tmp_path) == "J"  # the .jinja file wins
    (tmp_path / "chat_template.jinja").unlink()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": 3}))
    with pytest.raises(ChatTemplateError, match="tokenizer_config.json: chat_template must be a string"):
        read_chat_template(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ChatTemplateError, match="cannot read its chat template"):
        read_chat_template(tmp_path)


# ----------------------------------------------------------------------------- a chat model folder

CHATML = ("{{ bos_token }}{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
          "+ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory):
    """A random HF LLaMA whose tokenizer.json is byte-level BPE with <|im_start|>, <|im_end|>, <s> as special tokens."""
    from llama_oracle import hf_llama
    from refimpl.tokenizers.formats import byte_to_unicode

    d = tmp_path_factory.mktemp("chat_llama")
    alphabet = [byte_to_unicode()[b] for b in range(256)]
    merges = [("h", "i"), ("Ġ", "t"), ("e", "r"), ("Ġt", "h")]
    tokens = alphabet + ["".join(m) for m in merges]
    specials = ["<|im_start|>", "<|im_end|>", "<s>"]
    n = len(tokens)
    data = {"version": "1.0", "truncation": None, "padding": None, "normalizer": None,
            "added_tokens": [{"id": n + k, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True} for k, s in enumerate(specials)],
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                                "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {t: i for i, t in enumerate(tokens)}, "merges": [" ".join(m) for m in merges]}}
    hf_llama("llama", vocab_size=n + 3, bos_token_id=n + 2, eos_token_id=n + 1).save_pretrained(d)
    (d / "tokenizer.json").write_text(json.dumps(data))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "<|im_end|>",
        "chat_template": CHATML}))
    return d


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there, <|im_end|> the end"}]


def test_chat_prompt_ids_equal_apply_chat_template(chat_folder):
    import refimpl
    from refimpl.decoding import chat_prompt
    from transformers import AutoTokenizer

    model = refimpl.load(chat_folder)
    assert model.chat_template == CHATML
    theirs = AutoTokenizer.from_pretrained(chat_folder).apply_chat_template(MESSAGES, add_generation_prompt=True,
                                                                           tokenize=True, return_dict=False)
    ours = chat_prompt(model, MESSAGES)
    assert ours == list(theirs) and ours[0] == model.config.bos_token_id and ours.count(ours[0]) == 1  # one BOS
    g = refimpl.generate(model, messages=MESSAGES, max_new_tokens=4, eos_token_id=None)
    assert g.prompt_ids == ours and g.ids == refimpl.generate(model, ours, max_new_tokens=4, eos_token_id=None).ids
    with pytest.raises(TypeError, match="not both"):
        refimpl.generate(model, "x", messages=MESSAGES)
    with pytest.raises(ValueError, match="has a chat template but no tokenizer"):
        chat_prompt(dataclasses.replace(model, tokenizer=None), MESSAGES)
    with pytest.raises(ValueError, match="has no chat template"):
        chat_prompt(dataclasses.replace(model, chat_template=None), MESSAGES)


def test_generate_chat_cli(chat_folder, capsys):
    import refimpl
    from refimpl.__main__ import main
    from refimpl.decoding import chat_prompt

    model = refimpl.load(chat_folder)
    ids = chat_prompt(model, MESSAGES)
    assert main(["generate", "--model", str(chat_folder), "--chat", MESSAGES[1]["content"], "--system",
                 MESSAGES[0]["content"], "--max-new-tokens", "5", "--no-eos", "--timing"]) == 0
    out = capsys.readouterr().out
    expected = refimpl.generate(model, ids, max_new_tokens=5, eos_token_id=None).text
    assert out.startswith(expected + "\n") and f"prefill  {len(ids)} tokens" in out


@pytest.mark.parametrize("args, words", [
    (["--chat", "hi", "--prompt", "x"], "cannot be combined with --prompt"),
    (["--system", "s", "--prompt", "x"], "--system is the system message of a --chat"),
])
def test_generate_chat_cli_refusals(chat_folder, args, words, capsys):
    from refimpl.__main__ import main

    assert main(["generate", "--model", str(chat_folder), *args]) != 0
    assert words in capsys.readouterr().err


def test_generate_chat_cli_without_a_template_or_tokenizer(capsys):
    from refimpl.__main__ import main

    assert main(["generate", "--model", "shakespeare-llama", "--chat", "hi"]) != 0
    err = capsys.readouterr().err
    assert "--chat needs a chat template" in err and err.count("\n") == 1
    assert main(["generate", "--chat", "hi"]) != 0  # the default GPT-2 has no chat template either
    assert "--chat needs a chat template" in capsys.readouterr().err


def test_generate_chat_cli_without_a_tokenizer(chat_folder, tmp_path, capsys):
    import shutil

    from refimpl.__main__ import main

    bare = tmp_path / "no_tokenizer"
    shutil.copytree(chat_folder, bare)
    (bare / "tokenizer.json").unlink()  # the chat template stays (tokenizer_config.json)
    assert main(["generate", "--model", str(bare), "--chat", "hi"]) != 0
    err = capsys.readouterr().err
    assert "--chat needs a tokenizer" in err and err.count("\n") == 1
