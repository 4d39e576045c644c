"""The built-in tiny model: a small Llama/Qwen2 network and a locally trained tokenizer, fully offline.

Why it exists: tests, the quickstart and CPU learning experiments need a real causal LM with a real chat
template, and nothing may be downloaded from a model hub here. A ~1M-parameter model with a ~500-token
vocabulary generates thousands of tokens per second on two CPU cores and can learn simple tool-use
tasks within minutes (BC then GRPO on the calculator task took held-out success from 0.35 to 0.95 in under
3 minutes on two CPU cores).

The tokenizer is byte-level BPE (any Unicode string encodes without an unknown token and decodes back
exactly) and digit-level (every digit is its own token, which makes arithmetic learnable for a tiny
model). Its chat template is ChatML, which appends turns without re-rendering earlier ones, so the
:class:`~agentgym.agent.ChatAgent` can extend the token sequence exactly.

The model directory written by :func:`build_tiny_model` is an ordinary Hugging Face directory:
``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` load it, and so does
:meth:`agentgym.policies.hf.HFPolicy.from_pretrained`.
"""

from __future__ import annotations

import contextlib
import random
import re
import string
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentgym.errors import ConfigError, DependencyNotInstalled

if TYPE_CHECKING:  # pragma: no cover - typing only
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

__all__ = [
    "CHAT_TEMPLATE",
    "END_OF_TEXT",
    "IM_END",
    "IM_START",
    "SPECIAL_TOKENS",
    "TinyModelConfig",
    "build_tiny_model",
    "create_model",
    "default_corpus",
    "load_tiny_model",
    "quiet_progress_bars",
    "train_tokenizer",
]

END_OF_TEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
#: Special tokens, in id order (they take ids 0, 1, 2).
SPECIAL_TOKENS: tuple[str, ...] = (END_OF_TEXT, IM_START, IM_END)

_ROLES = ("system", "user", "assistant", "tool")
_BYTE_ALPHABET_SIZE = 256
_MIN_VOCAB = _BYTE_ALPHABET_SIZE + len(SPECIAL_TOKENS)

#: ChatML: ``<|im_start|>{role}\n{content}<|im_end|>\n`` per message, ``<|im_start|>assistant\n`` as the
#: generation prompt. Content may be a string, ``None`` (rendered empty) or a list of parts, of which the
#: ``text`` parts are rendered.
CHAT_TEMPLATE = (
    r"{%- for message in messages -%}"
    r"{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] -%}"
    r"{{- raise_exception('Unknown chat role ' ~ message['role'] ~ ': the tiny model template knows "
    r"system, user, assistant and tool.') -}}"
    r"{%- endif -%}"
    r"{{- '<|im_start|>' ~ message['role'] ~ '\n' -}}"
    r"{%- if message['content'] is string -%}{{- message['content'] -}}"
    r"{%- elif message['content'] -%}"
    r"{%- for part in message['content'] -%}{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    r"{%- endfor -%}"
    r"{%- endif -%}"
    r"{{- '<|im_end|>\n' -}}"
    r"{%- endfor -%}"
    r"{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of the tiny model and its tokenizer.

    The defaults (hidden 128, 4 layers, ~500 tokens) are the size measured to learn a calculator task
    by RL within minutes on two CPU cores; smaller shapes are useful in tests.

    Attributes:
        architecture: ``"llama"`` (LlamaForCausalLM) or ``"qwen2"`` (Qwen2ForCausalLM, which adds
            biases to the attention projections); both are served by vLLM, so a trained tiny model
            also runs there.
        hidden_size: Width of the residual stream.
        num_layers: Number of transformer blocks.
        num_heads: Attention heads; must divide ``hidden_size`` into an even head size (RoPE rotates
            pairs of dimensions).
        num_kv_heads: Key/value heads (grouped-query attention); must divide ``num_heads``.
        intermediate_size: Width of the MLP.
        max_position_embeddings: Longest sequence (prompt plus all turns) the model is built for.
        vocab_size: Target size of the BPE vocabulary, including the 256 byte tokens and the 3 special
            tokens; the trained vocabulary may be smaller when the corpus has too few distinct merges.
        seed: Seed of the weight initialisation; the same config gives identical weights.
        tie_word_embeddings: Share the input embedding and the output projection, which halves the
            parameters spent on the vocabulary.
    """

    architecture: str = "llama"
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 4
    intermediate_size: int = 512
    max_position_embeddings: int = 2048
    vocab_size: int = 512
    seed: int = 0
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        if self.architecture not in ("llama", "qwen2"):
            raise ConfigError(
                f"TinyModelConfig.architecture must be 'llama' or 'qwen2', got {self.architecture!r}."
            )
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
                     "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"TinyModelConfig.{name} must be a positive integer, got {value!r}.")
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"TinyModelConfig.hidden_size ({self.hidden_size}) must be divisible by num_heads "
                f"({self.num_heads}); pick num_heads among the divisors of hidden_size."
            )
        if (self.hidden_size // self.num_heads) % 2:
            raise ConfigError(
                f"The head size hidden_size / num_heads = {self.hidden_size // self.num_heads} must be even "
                "(rotary embeddings rotate pairs of dimensions); change hidden_size or num_heads."
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"TinyModelConfig.num_heads ({self.num_heads}) must be divisible by num_kv_heads "
                f"({self.num_kv_heads}); use num_kv_heads = num_heads for plain multi-head attention."
            )
        if not isinstance(self.vocab_size, int) or self.vocab_size < _MIN_VOCAB:
            raise ConfigError(
                f"TinyModelConfig.vocab_size must be an integer >= {_MIN_VOCAB} (256 byte tokens plus "
                f"{len(SPECIAL_TOKENS)} special tokens), got {self.vocab_size!r}."
            )
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"TinyModelConfig.seed must be a non-negative integer, got {self.seed!r}.")


# ---- corpus --------------------------------------------------------------------------------------

_WORDS = (
    "higher", "lower", "correct", "north", "south", "east", "west", "wall", "goal", "maze", "number",
    "guess", "answer", "result", "error", "tool", "call", "calculator", "expression", "search", "query",
    "question", "the", "a", "an", "is", "to", "of", "and", "you", "your", "use", "then", "give", "final",
    "between", "too", "high", "low", "move", "step", "turn", "task", "done", "yes", "no", "true", "false",
)

_INSTRUCTIONS = (
    "You are a helpful agent. Use the tools to solve the task, then give the final answer.",
    "Compute the value of the expression with the calculator, then answer with the number.",
    "Call a tool with <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>.",
    "Guess the secret number between 1 and 100. After each guess you are told higher, lower or correct.",
    "Find the way out of the maze. Move north, south, east or west until you reach the goal.",
    "Answer with answer(N) where N is the result.",
    "Think step by step, but keep your reply short.",
    "The observation tells you what happened after your last action.",
    "Reply with exactly one action per turn.",
    "If a tool returns an error, fix the arguments and try again.",
)


def default_corpus() -> list[str]:
    """A built-in synthetic corpus that gives the tokenizer sensible merges without any download.

    It covers printable ASCII, digits and arithmetic, Hermes/Qwen ``<tool_call>`` JSON snippets,
    function-call strings (``calc(27*42)``, ``answer(1134)``, ``guess(50)``, ``move("north")``), the
    words the built-in games use, and short English instructions. It is generated from a fixed seed, so
    every call returns the same list (and so the same tokenizer).

    Returns:
        About two thousand short lines of text.
    """
    rng = random.Random(0)
    lines: list[str] = [string.printable, string.ascii_letters, string.digits, string.punctuation]
    lines.extend(_INSTRUCTIONS)
    # Chat template headers (without the special tokens, which never take part in merges).
    lines.extend(f"{role}\n" for role in _ROLES for _ in range(20))
    directions = ("north", "south", "east", "west")
    for _ in range(300):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        op = rng.choice("+-*")
        value = a + b if op == "+" else a - b if op == "-" else a * b
        expr = f"{a}{op}{b}"
        lines.append(f"What is {a} {op} {b}? Use the calculator.")
        lines.append(f"calc({expr})")
        lines.append(f"Result: {value}")
        lines.append(f"answer({value})")
        lines.append(f"{a} {op} {b} = {value}")
        lines.append(f'<tool_call>{{"name": "calc", "arguments": {{"expression": "{expr}"}}}}</tool_call>')
        lines.append(f'<tool_call>{{"name": "answer", "arguments": {{"value": {value}}}}}</tool_call>')
        lines.append(f"<answer>{value}</answer>")
    for _ in range(150):
        guess = rng.randint(1, 100)
        lines.append(f"guess({guess})")
        lines.append(f"{guess} is {rng.choice(('too high', 'too low', 'correct'))}. Guess {rng.choice(('higher', 'lower'))}.")
        direction = rng.choice(directions)
        lines.append(f'move("{direction}")')
        lines.append(f'<tool_call>{{"name": "move", "arguments": {{"direction": "{direction}"}}}}</tool_call>')
        lines.append(f"You moved {direction}. There is a wall to the {rng.choice(directions)}.")
    for _ in range(200):
        lines.append(" ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 10))) + rng.choice(".?!"))
    for _ in range(50):
        a, b = rng.randint(1, 999), rng.randint(1, 999)
        lines.append(f"```python\nprint({a} * {b})\n```")
        lines.append(f'{{"name": "python", "arguments": {{"code": "print({a} + {b})"}}}}')
    return lines


# ---- tokenizer -----------------------------------------------------------------------------------


def _require(package: str) -> Any:
    try:
        import importlib

        return importlib.import_module(package)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise DependencyNotInstalled(package, "train", "the built-in tiny model") from exc


_SPECIAL_SPLIT = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS))


def _without_special_tokens(texts: Iterable[str]) -> Iterator[str]:
    """The pieces of each text between special tokens.

    BPE training does not treat special tokens as atoms, so chat-rendered training texts would otherwise
    spend vocabulary on merges such as ``<|`` and ``im`` that encoding never uses.
    """
    for text in texts:
        for piece in _SPECIAL_SPLIT.split(text):
            if piece:
                yield piece


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level, digit-level BPE tokenizer with a ChatML chat template.

    Byte-level means every Unicode string (emoji, CJK, control characters) encodes without an unknown
    token and ``decode(encode(s)) == s``. Digits are split into single characters before the byte-level
    step, so no merge can ever join two digits (nor a digit with anything else): numbers stay spelled
    digit by digit, which a tiny model can learn arithmetic and copying on.

    Args:
        texts: Training texts (e.g. :func:`default_corpus` plus task prompts).
        vocab_size: Target vocabulary size, counting the 256 byte tokens and the 3 special tokens.

    Returns:
        A fast tokenizer with ``<|endoftext|>`` as pad token, ``<|im_end|>`` as EOS token,
        ``<|im_start|>`` as an extra special token, no BOS token, and the ChatML template.

    Raises:
        ConfigError: If ``vocab_size`` is too small to hold the byte alphabet and the special tokens.
        DependencyNotInstalled: If ``tokenizers`` or ``transformers`` is missing.
    """
    if not isinstance(vocab_size, int) or vocab_size < _MIN_VOCAB:
        raise ConfigError(
            f"vocab_size must be an integer >= {_MIN_VOCAB} (256 byte tokens plus {len(SPECIAL_TOKENS)} special "
            f"tokens), got {vocab_size!r}."
        )
    tokenizers = _require("tokenizers")
    transformers = _require("transformers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_without_special_tokens(texts), trainer=trainer)
    # transformers 5 renamed the list of unnamed special tokens.
    extra_key = "additional_special_tokens" if transformers.__version__.split(".")[0] == "4" else "extra_special_tokens"
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        bos_token=None,
        unk_token=None,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        padding_side="left",
        **{extra_key: [IM_START]},
    )


# ---- model ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def quiet_progress_bars() -> Iterator[None]:
    """Hide transformers' per-file progress bars while saving or loading a small model.

    A tiny model loads in milliseconds; the bars would only clutter the quickstart's and the CLI's
    output. The previous setting is restored afterwards.
    """
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def create_model(tokenizer: Any, config: TinyModelConfig = TinyModelConfig()) -> PreTrainedModel:
    """Build a freshly initialised model for ``tokenizer`` (in memory, nothing saved).

    The weights depend only on ``config`` (including ``config.seed``) and the tokenizer's size, so the
    same inputs give identical weights; the global torch RNG is left untouched.

    Args:
        tokenizer: The tokenizer the model will read (its size sets the embedding rows; its pad, EOS
            and end-of-text tokens set the model's special ids).
        config: Shape and seed.

    Returns:
        A ``LlamaForCausalLM`` or ``Qwen2ForCausalLM`` in eval mode, float32, on the CPU.
    """
    torch = _require("torch")
    transformers = _require("transformers")
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    eot_id = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    common: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": eot_id,
        "eos_token_id": eos_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if config.architecture == "llama":
        model_config = transformers.LlamaConfig(**common)
        model_cls = transformers.LlamaForCausalLM
    else:
        model_config = transformers.Qwen2Config(**common)
        model_cls = transformers.Qwen2ForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = model_cls(model_config)
    # No max_length: a saved max_length makes transformers warn on every generate(max_new_tokens=...) call
    # ("Both max_new_tokens and max_length seem to have been set"); the context limit is in the model config.
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=eot_id,
        eos_token_id=[eos_id, eot_id],
        pad_token_id=tokenizer.pad_token_id,
    )
    return model.float().eval()


def build_tiny_model(
    output_dir: str | Path,
    *,
    texts: Iterable[str] | None = None,
    config: TinyModelConfig = TinyModelConfig(),
) -> Path:
    """Train the tokenizer, build the model and save both as a Hugging Face model directory.

    Args:
        output_dir: Where to save (created if missing; existing model files are overwritten).
        texts: Extra tokenizer training texts (e.g. the prompts and demonstrations of the task suite the
            model will learn), added to :func:`default_corpus` so common strings get their own tokens.
        config: Shape, vocabulary size and seed.

    Returns:
        The directory, loadable with ``AutoModelForCausalLM.from_pretrained`` /
        ``AutoTokenizer.from_pretrained``, :func:`load_tiny_model` or ``HFPolicy.from_pretrained``.

    Raises:
        DependencyNotInstalled: If torch, transformers or tokenizers is missing.
    """
    out = Path(output_dir)
    corpus = default_corpus()
    if texts is not None:
        corpus.extend(texts)
    tokenizer = train_tokenizer(corpus, config.vocab_size)
    tokenizer.model_max_length = config.max_position_embeddings
    model = create_model(tokenizer, config)
    out.mkdir(parents=True, exist_ok=True)
    with quiet_progress_bars():
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    return out


def load_tiny_model(path: str | Path) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Load a model directory written by :func:`build_tiny_model` (or a trainer checkpoint of it).

    Args:
        path: The model directory.

    Returns:
        ``(model, tokenizer)``, the model in eval mode on the CPU.

    Raises:
        ConfigError: If ``path`` is not a model directory.
        DependencyNotInstalled: If torch or transformers is missing.
    """
    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise ConfigError(
            f"{directory} is not a model directory (no config.json); build one with "
            "agentgym.models.build_tiny_model(path) first."
        )
    _require("torch")
    transformers = _require("transformers")
    with quiet_progress_bars():
        model = transformers.AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return model.eval(), tokenizer
