"""Offline tokenizers with the chat formats of real model families (for token-exact agent tests).

Each family gets a byte-level BPE tokenizer with no merges (every byte is one token, so encoding is exact and
fast) plus the family's real special tokens with their real strings, and a Jinja chat template written here
from the family's published format (simplified: the parts an agent loop exercises - system/user/assistant/tool
roles, tool schemas, generation prompt, reasoning stripping). No download: tests build them in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

__all__ = ["FAMILIES", "Family", "build_model", "build_tokenizer"]

_TOOLS_JSON = "{% for t in tools %}{{ t | tojson }}\n{% endfor %}"

_CHATML_TOOLS = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n<tools>\n" + _TOOLS_JSON + "</tools><|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{% endif %}"
)
_CHATML_TOOL_MSG = (
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
)

QWEN25 = (
    _CHATML_TOOLS
    + "{%- for m in messages %}{%- if m.role == 'system' %}"
    "{%- elif m.role in ('user', 'assistant') %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    + _CHATML_TOOL_MSG
    + "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen3: an assistant message after the last real user query keeps its reasoning (and, when it is the last
# message, always gets a think block); earlier assistant messages lose it.
QWEN3 = (
    _CHATML_TOOLS
    + "{%- set ns = namespace(last_query=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}{%- if m.role == 'system' %}"
    "{%- elif m.role == 'user' %}<|im_start|>user\n{{ m.content }}<|im_end|>\n"
    "{%- elif m.role == 'assistant' %}"
    "{%- set content = m.content %}{%- set reasoning = '' %}"
    "{%- if '</think>' in content %}{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\n') %}{%- endif %}"
    "{%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}"
    "<|im_start|>assistant\n<think>\n{{ reasoning }}\n</think>\n\n{{ content }}<|im_end|>\n"
    "{%- else %}<|im_start|>assistant\n{{ content }}<|im_end|>\n{% endif %}"
    + _CHATML_TOOL_MSG
    + "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

LLAMA31 = (
    "<|begin_of_text|>{%- if messages[0].role == 'system' or tools %}<|start_header_id|>system<|end_header_id|>\n\n"
    "{%- if tools %}Environment: ipython\n{% endif %}"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}"
    "{%- if tools %}\n\nYou have access to the following functions:\n" + _TOOLS_JSON + "{%- endif %}<|eot_id|>"
    "{%- endif %}"
    "{%- for m in messages %}{%- if m.role != 'system' %}"
    "<|start_header_id|>{{ 'ipython' if m.role == 'tool' else m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

MISTRAL = (
    "<s>{%- set ns = namespace(first=true) %}{%- for m in messages %}"
    "{%- if m.role == 'user' %}{%- if ns.first and tools %}[AVAILABLE_TOOLS] [{{ tools | map('tojson') | join(', ') }}]"
    "[/AVAILABLE_TOOLS]{%- endif %}[INST] {% if ns.first and messages[0].role == 'system' %}"
    "{{ messages[0].content }}\n\n{% endif %}{{ m.content }}[/INST]{%- set ns.first = false %}"
    "{%- elif m.role == 'assistant' %}{{ m.content }}</s>"
    "{%- elif m.role == 'tool' %}[TOOL_RESULTS] {{ m.content }}[/TOOL_RESULTS]{%- endif %}{%- endfor %}"
)

# Gemma 2/3: no system role (it is folded into the first user turn), the assistant is "model".
GEMMA = (
    "<bos>{%- for m in messages %}{%- if m.role != 'system' %}"
    "<start_of_turn>{{ 'model' if m.role == 'assistant' else 'user' }}\n"
    "{%- if loop.index0 == 1 and messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "{%- if loop.index0 <= 1 and tools %}Tools:\n" + _TOOLS_JSON + "\n{% endif %}"
    "{{ m.content }}<end_of_turn>\n{% endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

# DeepSeek-R1-Distill: every assistant message loses everything up to </think>; the generation prompt opens
# the think block.
DEEPSEEK_R1 = (
    "<｜begin▁of▁sentence｜>{%- if messages[0].role == 'system' %}{{ messages[0].content }}{%- endif %}"
    "{%- if tools %}\n\n## Tools\n" + _TOOLS_JSON + "{%- endif %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}<｜User｜>{{ m.content }}"
    "{%- elif m.role == 'assistant' %}<｜Assistant｜>{{ m.content.split('</think>')[-1] }}<｜end▁of▁sentence｜>"
    "{%- elif m.role == 'tool' %}<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{{ m.content }}"
    "<｜tool▁output▁end｜><｜tool▁outputs▁end｜>{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}"
)


@dataclass(frozen=True)
class Family:
    """A chat format: its template, special tokens, the end-of-turn token and whether it re-renders history."""

    name: str
    template: str
    special_tokens: tuple[str, ...]
    end_token: str
    eos_tokens: tuple[str, ...]
    rerenders: bool = False  # earlier assistant turns are rendered differently once later messages exist


FAMILIES: tuple[Family, ...] = (
    Family("qwen2.5", QWEN25, ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), "<|im_end|>",
           ("<|im_end|>", "<|endoftext|>")),
    Family("qwen3", QWEN3, ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), "<|im_end|>",
           ("<|im_end|>", "<|endoftext|>"), rerenders=True),
    Family("llama3.1", LLAMA31, ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                                 "<|eom_id|>", "<|end_of_text|>"), "<|eot_id|>",
           ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")),
    Family("mistral", MISTRAL, ("<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                                "[TOOL_RESULTS]", "[/TOOL_RESULTS]"), "</s>", ("</s>",)),
    Family("gemma", GEMMA, ("<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"), "<end_of_turn>",
           ("<end_of_turn>", "<eos>")),
    Family("deepseek-r1-distill", DEEPSEEK_R1, ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>",
                                                "<｜Assistant｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁output▁begin｜>",
                                                "<｜tool▁output▁end｜>", "<｜tool▁outputs▁end｜>"),
           "<｜end▁of▁sentence｜>", ("<｜end▁of▁sentence｜>",), rerenders=True),
)


def build_tokenizer(family: Family) -> Any:
    """A byte-level tokenizer (one token per byte) with the family's special tokens and chat template."""
    vocab = {ch: i for i, ch in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core)
    tok.add_special_tokens({"additional_special_tokens": list(family.special_tokens)})
    tok.eos_token = family.eos_tokens[0]
    tok.pad_token = family.eos_tokens[0]
    # Jinja's '{%-' would eat the newline the format puts before a tag; HF templates keep it.
    tok.chat_template = family.template.replace("\n{%-", "\n{%")
    return tok


def build_model(family: Family, tokenizer: Any) -> Any:
    """A random tiny Llama-architecture causal LM over ``tokenizer``'s vocab, ending turns on the family's ids.

    The architecture does not matter for the chat format; what matters is ``generation_config.eos_token_id``
    listing the family's end tokens, which is how HF models of these families stop.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = [tokenizer.convert_tokens_to_ids(t) for t in family.eos_tokens]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model
