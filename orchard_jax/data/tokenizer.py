"""Tokenizers: a Hugging Face tokenizer folder, or the project's tiny byte-level BPE.

Every tokenizer the project uses is a Hugging Face *fast* tokenizer (the `tokenizers` library
under transformers' `PreTrainedTokenizerFast`) together with its chat template, wrapped in
`Tokenizer`, which adds the ids the project needs (end-of-turn stop ids, padding) and chat
rendering to token ids.

The tiny presets (vocab 8192) use a byte-level BPE trained here, in a few seconds, on the
Python standard library's source files, which every machine with Python has. Training is
deterministic: the same corpus gives the same tokenizer.json byte for byte. The corpus is the
running interpreter's standard library, so two machines with different Python patch releases
can train different tokenizers; the cache folder is keyed by a fingerprint of the corpus, and a
checkpoint should carry the tokenizer folder it was trained with (`Tokenizer.save`).
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import sysconfig
import tempfile
from pathlib import Path
from typing import Any, Sequence

from orchard_jax.data.chat import QWEN3_CHAT_TEMPLATE
from orchard_jax.data.errors import ChatTemplateError, TokenizerError

_log = logging.getLogger(__name__)

# Qwen's chat markup. The first three are special tokens (dropped by
# decode(skip_special_tokens=True)); the tool and reasoning tags are added tokens that are not
# special, as in Qwen3's tokenizer, so decoded text keeps them and tool calls stay parsable.
QWEN_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
QWEN_MARKUP_TOKENS = (
  "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
TINY_VOCAB_SIZE = 8192

# Bumped whenever the tiny tokenizer's recipe (corpus selection, regex, trainer settings)
# changes, so an old cache entry is never mistaken for the new recipe's output.
_TINY_RECIPE_VERSION = 2
_TINY_PREFIX = "tiny-bpe"
# Pre-tokenisation split: the GPT-4 / Qwen2 style pattern (contractions, letter runs with one
# leading non-letter, single digits, punctuation runs, newline runs, other whitespace).
_SPLIT_PATTERN = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Standard-library folders left out of the corpus: tests (huge, repetitive), GUI and demo code.
_CORPUS_SKIP_DIRS = frozenset({
  "site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo",
  "ensurepip", "__pycache__", "tkinter", "pydoc_data"})
_CORPUS_MAX_CHARS_PER_FILE = 20_000
_CORPUS_MIN_CHARS = 1_000_000
_METADATA_FILE = "orchard_tokenizer.json"
# Texts at least this long are encoded with the GIL released (`Tokenizer.encode`); below it the
# single-text call is a few microseconds cheaper and over in well under a millisecond.
GIL_FREE_CHARS = 4096
# Where chat templates read a message's reasoning; the first one set is copied under
# `reasoning_content` and `thinking` (as transformers' apply_chat_template does).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class Tokenizer:
  """A fast Hugging Face tokenizer with its chat template and the project's special ids.

  Attributes:
    hf: the wrapped `transformers.PreTrainedTokenizerFast` (for anything not wrapped here).
    name: where it came from (a folder, a hub name, or "tiny").
    eos_id: id that ends an assistant turn (Qwen chat models: <|im_end|>).
    stop_ids: every id that ends generation: eos_id, <|im_end|> and <|endoftext|> when present,
      and the folder's generation_config.json eos_token_id list.
    pad_id: id used for padding (pad token, else <|endoftext|>, else eos).
    image_token_id: id of <|image_pad|> (Qwen3-VL's image placeholder), or None.
  """

  def __init__(self, hf: Any, *, name: str, extra_stop_ids: Sequence[int] = ()):
    if not getattr(hf, "is_fast", False):
      raise TokenizerError(
        f"tokenizer {name!r} is a slow (pure Python) tokenizer; orchard_jax needs a fast one "
        "(a folder with tokenizer.json)")
    self.hf = hf
    self.name = name
    self._backend = hf.backend_tokenizer
    im_end = self.token_to_id("<|im_end|>")
    endoftext = self.token_to_id("<|endoftext|>")
    eos = hf.eos_token_id if hf.eos_token_id is not None else im_end
    if eos is None:
      raise TokenizerError(
        f"tokenizer {name!r} has no eos token and no <|im_end|> token; cannot tell where a "
        "turn ends")
    self.eos_id: int = int(eos)
    stops = [self.eos_id, im_end, endoftext, *extra_stop_ids]
    self.stop_ids: tuple[int, ...] = tuple(dict.fromkeys(int(s) for s in stops if s is not None))
    pad = hf.pad_token_id if hf.pad_token_id is not None else endoftext
    self.pad_id: int = int(pad if pad is not None else self.eos_id)
    # Qwen3-VL's image placeholder, when the vocabulary has it (vision-language tokenizers).
    self.image_token_id: int | None = self.token_to_id("<|image_pad|>")

  def __repr__(self) -> str:
    return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size})"

  @property
  def vocab_size(self) -> int:
    """Number of ids, added tokens included (ids run 0 .. vocab_size - 1)."""
    return len(self.hf)

  @property
  def chat_template(self) -> str | None:
    """The Jinja chat template string, or None when the folder has none."""
    template = self.hf.chat_template
    return template if isinstance(template, str) else None

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`; no BOS/EOS is added, special-token strings in it become their ids.

    A text of `GIL_FREE_CHARS` or more is encoded as a batch of one: the `tokenizers` binding's
    encode_batch releases the GIL while it works, its encode does not (tokenizers 0.23: a 5 MB
    prompt held it 7.5 s, stalling every other thread of the process, an inference server's
    and a recording proxy's other requests included; as a batch of one the other threads ran
    throughout). The ids are the same (one encoding algorithm; test_tokenizer holds them
    equal).
    """
    if len(text) >= GIL_FREE_CHARS:
      return self._backend.encode_batch([text], add_special_tokens=False)[0].ids
    return self._backend.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """`encode` for many texts at once (parallel in the Rust backend)."""
    return [e.ids for e in self._backend.encode_batch(list(texts), add_special_tokens=False)]

  def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
    """Text of `ids`. Decoding then encoding is not always the identity (docs/cases.md 2)."""
    return self._backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def token_to_id(self, token: str) -> int | None:
    """Id of one token string, or None when the vocabulary lacks it."""
    return self._backend.token_to_id(token)

  def id_to_token(self, token_id: int) -> str | None:
    """Token string of one id, or None when out of range."""
    return self._backend.id_to_token(int(token_id))

  def render_chat_text(self, messages: Sequence[dict], tools: Sequence[dict] | None = None,
                       add_generation_prompt: bool = True, **template_kwargs: Any) -> str:
    """Render a chat with the tokenizer's chat template (transformers' apply_chat_template).

    Args:
      messages: OpenAI-format messages (role system/user/assistant/tool; assistant messages may
        carry tool_calls and reasoning_content; tool messages carry tool results).
      tools: OpenAI-format tool schemas ({"type": "function", "function": {...}}), or None.
      add_generation_prompt: end with the header of a new assistant turn.
      **template_kwargs: extra template variables (e.g. enable_thinking=False).
    Returns:
      The rendered prompt text.
    Raises:
      ChatTemplateError: the tokenizer has no chat template, or the template rejected the chat.
    """
    if self.chat_template is None:
      raise ChatTemplateError(f"tokenizer {self.name!r} has no chat template")
    try:
      return self.hf.apply_chat_template(
        list(messages), tools=list(tools) if tools else None, tokenize=False,
        add_generation_prompt=add_generation_prompt, **template_kwargs)
    except Exception as e:  # jinja2 raises TemplateError, templates raise their own errors
      raise self._template_failed(messages, e) from e

  def render_json_chat_text(self, messages: Sequence[dict], tools: Sequence[dict] | None = None,
                            add_generation_prompt: bool = True, **template_kwargs: Any) -> str:
    """`render_chat_text` for a chat that holds JSON values only (dicts, lists, strings,
    numbers, booleans and None, as parsed from a request body): the same text, rendered with
    the compiled template directly.

    transformers' `apply_chat_template` first rebuilds every message, tool and template
    variable out of plain JSON types (pydantic models, dataclasses and arrays become dicts,
    lists and placeholders), which on JSON data is a deep copy that costs about as much as
    rendering the template. This does the rest of what it does: the same compiled template
    (transformers' sandboxed environment, compiled once), each message without its None-valued
    keys and with its reasoning under `reasoning_content` and `thinking`, the tokenizer's
    special tokens as variables beneath `template_kwargs`, no documents. A template kept as
    several named templates is rendered by `render_chat_text`.

    Args / Returns: as `render_chat_text`; messages must be dicts of JSON values.
    Raises:
      ChatTemplateError: as `render_chat_text`, or a message that is not a dict.
    """
    compiled = self._compiled_template()
    if compiled is None:
      return self.render_chat_text(messages, tools, add_generation_prompt=add_generation_prompt,
                                   **template_kwargs)
    try:
      if not messages:
        raise ValueError("cannot render an empty conversation; expected at least one message")
      chat = []
      for message in messages:
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None),
                         None)
        if reasoning is not None:
          message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        chat.append(message)
      return compiled[1].render(messages=chat, tools=list(tools) if tools else None,
                                documents=None, add_generation_prompt=add_generation_prompt,
                                **{**compiled[2], **template_kwargs})
    except Exception as e:  # jinja2 raises TemplateError, templates raise their own errors
      raise self._template_failed(messages, e) from e

  def _template_failed(self, messages: Sequence[Any], error: Exception) -> ChatTemplateError:
    """The one-line error of a chat the template rejected: how many messages, their roles."""
    roles = [m.get("role") if isinstance(m, dict) else m for m in messages]
    return ChatTemplateError(f"chat template of {self.name!r} failed on {len(messages)} "
                             f"messages (roles {roles}): {error}")

  def _compiled_template(self) -> tuple[str, Any, dict] | None:
    """(template text, the template compiled by transformers, the special tokens map) for
    `render_json_chat_text`, remade when the template text changes; None without a single
    template or without transformers' compiler."""
    template = self.chat_template
    if template is None:
      return None
    cached = self.__dict__.get("_compiled")
    if cached is None or cached[0] is not template:
      try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
      except ImportError:   # a transformers release that moved it: the general path
        return None
      cached = (template, _compile_jinja_template(template), dict(self.hf.special_tokens_map))
      self.__dict__["_compiled"] = cached
    return cached

  def render_chat(self, messages: Sequence[dict], tools: Sequence[dict] | None = None,
                  add_generation_prompt: bool = True, **template_kwargs: Any) -> list[int]:
    """Token ids of `render_chat_text(...)` (see there). Returns a list of ints."""
    return self.encode(self.render_chat_text(
      messages, tools, add_generation_prompt=add_generation_prompt, **template_kwargs))

  def render_continuation(self, messages: Sequence[dict], num_recorded: int,
                          tools: Sequence[dict] | None = None,
                          add_generation_prompt: bool = True, **template_kwargs: Any) -> str:
    """Text the chat template adds after an assistant turn that was sampled and recorded.

    The recording proxy holds a session's ids up to the end-of-turn token the model sampled
    (prompt + output of the last call). When the harness sends the chat again with new
    messages (tool results, a user turn), the ids of the next prompt are the recorded ids +
    encode(this text), never a re-rendering of what was recorded (docs/cases.md 1). Special
    tokens split the text, so encoding the continuation on its own matches a joint encoding.

    Args:
      messages: the whole chat of the new request.
      num_recorded: how many leading messages the recorded ids cover; messages[num_recorded-1]
        is the assistant turn that was sampled.
      tools, add_generation_prompt, **template_kwargs: as in `render_chat_text`.
    Returns:
      The text after the recorded turn's end-of-turn token (e.g. "\\n<|im_start|>user\\n
      <tool_response>\\n...</tool_response><|im_end|>\\n<|im_start|>assistant\\n").
    Raises:
      ChatTemplateError: messages[num_recorded-1] is not an assistant turn, or the renderings
        do not hold the recorded turn's end-of-turn token; the caller then starts a new
        segment from a full rendering.

    Templates that rewrite history once more turns follow (Qwen3's official one drops earlier
    turns' reasoning and inserts an empty think block only into the last turn) are handled:
    the continuation starts after the same number of end-of-turn tokens in the whole chat's
    rendering as the recorded messages' rendering holds.
    """
    if (not 0 < num_recorded <= len(messages)
        or messages[num_recorded - 1].get("role") != "assistant"):
      raise ChatTemplateError(
        f"num_recorded={num_recorded} must point just past an assistant message; roles are "
        f"{[m.get('role') for m in messages]}")
    eos = self.id_to_token(self.eos_id)
    recorded = self.render_chat_text(messages[:num_recorded], tools, add_generation_prompt=False,
                                     **template_kwargs)
    full = self.render_chat_text(messages, tools, add_generation_prompt=add_generation_prompt,
                                 **template_kwargs)
    end = recorded.rfind(eos)
    if end < 0:
      raise ChatTemplateError(
        f"the rendered assistant turn does not contain the eos token {eos!r}; cannot find "
        "where the recorded ids end")
    end += len(eos)
    if full.startswith(recorded[:end]):
      return full[end:]
    turns = recorded[:end].count(eos)
    pos = -len(eos)
    for _ in range(turns):
      pos = full.find(eos, pos + len(eos))
      if pos < 0:
        raise ChatTemplateError(
          f"the whole chat's rendering holds fewer than the {turns} end-of-turn tokens {eos!r} "
          "of the recorded messages' rendering")
    return full[pos + len(eos):]

  def save(self, folder: str | os.PathLike) -> Path:
    """Write the tokenizer as a Hugging Face folder (tokenizer.json, config, chat template)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    self.hf.save_pretrained(str(folder))
    return folder


def load_tokenizer(path_or_name: str | os.PathLike) -> Tokenizer:
  """Load a tokenizer: "tiny", a Hugging Face tokenizer folder, or a hub model name.

  Args:
    path_or_name: "tiny" for the project's tiny BPE, "tiny_vl" for it with Qwen3-VL's vision
      tokens and chat template (tiny_vl_tokenizer); a folder holding tokenizer.json and
      tokenizer_config.json (and optionally chat_template.jinja, generation_config.json); or a
      hub name such as "Qwen/Qwen3-30B-A3B" (needs network or the HF cache).
  Returns:
    The `Tokenizer`.
  Raises:
    TokenizerError: nothing loadable there, or only a slow tokenizer.
  """
  if str(path_or_name) == "tiny":
    return tiny_tokenizer()
  if str(path_or_name) == "tiny_vl":
    return tiny_vl_tokenizer()
  name = str(path_or_name)
  if not Path(name).exists() and (isinstance(path_or_name, os.PathLike)
                                  or name.startswith(("/", ".", "~"))):
    raise TokenizerError(
      f"cannot load a tokenizer from {name!r}: no such folder (expected 'tiny', a folder with "
      "tokenizer.json, or a Hugging Face hub name)")
  try:
    if (Path(name) / "tokenizer.json").is_file():
      # A fast tokenizer's folder loads as the generic class: the Qwen classes add nothing
      # to tokenizer.json + tokenizer_config.json, and AutoTokenizer's imports take seconds.
      from transformers import PreTrainedTokenizerFast

      hf = PreTrainedTokenizerFast.from_pretrained(name)
    else:
      from transformers import AutoTokenizer

      hf = AutoTokenizer.from_pretrained(name)
  except Exception as e:
    raise TokenizerError(
      f"cannot load a tokenizer from {name!r}: expected 'tiny', a folder with tokenizer.json, "
      f"or a Hugging Face hub name ({type(e).__name__}: {e})") from e
  return Tokenizer(hf, name=name, extra_stop_ids=_generation_config_eos(name))


def tokenizer_cache_dir() -> Path:
  """Folder of cached tokenizers: $XDG_CACHE_HOME/orchard_jax/tokenizers (~/.cache by default)."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return Path(base) / "orchard_jax" / "tokenizers"


@functools.lru_cache(maxsize=4)
def tiny_tokenizer(cache_dir: str | None = None) -> Tokenizer:
  """The tiny presets' byte-level BPE (vocab 8192 with the Qwen chat markup), trained once.

  The first call on a machine trains it from the standard library's source (a few seconds)
  and saves it under `tokenizer_cache_dir()`; later calls load the cached folder. The folder
  name holds a fingerprint of the corpus and the recipe, so a changed corpus never reuses a
  stale tokenizer.

  Args:
    cache_dir: override of `tokenizer_cache_dir()`.
  Returns:
    The `Tokenizer`; vocab_size == 8192, chat template = `chat.QWEN3_CHAT_TEMPLATE`.
  """
  from transformers import PreTrainedTokenizerFast

  folder = _tiny_folder(cache_dir)
  return Tokenizer(PreTrainedTokenizerFast.from_pretrained(str(folder)), name="tiny")


@functools.lru_cache(maxsize=4)
def tiny_vl_tokenizer(cache_dir: str | None = None) -> Tokenizer:
  """The tiny tokenizer with Qwen3-VL's five vision tokens (<|vision_start|>, <|vision_end|>,
  <|vision_pad|>, <|image_pad|>, <|video_pad|>: special, ids 8192..8196, in Qwen's order) and
  `chat.QWEN3_VL_CHAT_TEMPLATE`: the tokenizer of the tiny_vl / small_vl model presets
  (vocab_size 8197; the models' vocabulary is 8256).

  Args:
    cache_dir: override of `tokenizer_cache_dir()` (where the tiny BPE is cached).
  """
  from transformers import PreTrainedTokenizerFast

  from orchard_jax.data.chat import QWEN3_VL_CHAT_TEMPLATE
  from orchard_jax.data.images import VISION_TOKENS

  hf = PreTrainedTokenizerFast.from_pretrained(str(_tiny_folder(cache_dir)))
  hf.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
  hf.chat_template = QWEN3_VL_CHAT_TEMPLATE
  ids = [hf.convert_tokens_to_ids(t) for t in VISION_TOKENS]
  if ids != list(range(TINY_VOCAB_SIZE, TINY_VOCAB_SIZE + len(VISION_TOKENS))):
    raise TokenizerError(f"the tiny tokenizer's vision tokens got ids {ids}; expected "
                         f"{TINY_VOCAB_SIZE}..{TINY_VOCAB_SIZE + len(VISION_TOKENS) - 1}")
  return Tokenizer(hf, name="tiny_vl")


def _tiny_folder(cache_dir: str | None) -> Path:
  """The cached tiny BPE folder, trained first when missing."""
  root = Path(cache_dir) if cache_dir else tokenizer_cache_dir()
  texts, fingerprint = stdlib_corpus()
  folder = root / f"{_TINY_PREFIX}{TINY_VOCAB_SIZE}-{fingerprint[:16]}"
  if not (folder / _METADATA_FILE).exists():
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".training-", dir=root))
    try:
      train_tiny_tokenizer(texts, scratch, vocab_size=TINY_VOCAB_SIZE,
                           corpus_fingerprint=fingerprint)
      try:
        os.rename(scratch, folder)  # atomic: readers see a whole folder or none
      except OSError:
        if not (folder / _METADATA_FILE).exists():
          raise
        _log.info("another process trained %s first; using its copy", folder)
    finally:
      shutil.rmtree(scratch, ignore_errors=True)
  return folder


def train_tiny_tokenizer(texts: Sequence[str], folder: str | os.PathLike, *,
                         vocab_size: int = TINY_VOCAB_SIZE,
                         corpus_fingerprint: str = "") -> Path:
  """Train a byte-level BPE with the Qwen chat markup and save it as a Hugging Face folder.

  The vocabulary holds the 9 markup tokens first (ids 0..8: <|endoftext|>, <|im_start|>,
  <|im_end|>, then the tool and think tags), then the 256 byte symbols, then merges, for
  exactly `vocab_size` ids. Same texts -> same tokenizer.json (the trainer is deterministic).

  Args:
    texts: training corpus.
    folder: where to write tokenizer.json, tokenizer_config.json, chat_template.jinja and
      orchard_tokenizer.json (recipe metadata).
    vocab_size: total number of ids, markup tokens included.
    corpus_fingerprint: recorded in the metadata file.
  Returns:
    The folder.
  Raises:
    TokenizerError: the corpus is too small to reach vocab_size.
  """
  import tokenizers
  from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast

  markup = list(QWEN_SPECIAL_TOKENS) + list(QWEN_MARKUP_TOKENS)
  bpe = tokenizers.Tokenizer(models.BPE())
  bpe.normalizer = normalizers.NFC()
  bpe.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  bpe.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size, special_tokens=markup, min_frequency=2, show_progress=False,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  bpe.train_from_iterator(list(texts), trainer=trainer, length=len(texts))
  if bpe.get_vocab_size() != vocab_size:
    raise TokenizerError(
      f"BPE training reached {bpe.get_vocab_size()} ids, expected {vocab_size}: the corpus "
      f"({sum(map(len, texts))} characters) is too small")
  # The trainer registers every markup token as special; Qwen keeps the tool/think tags
  # non-special so that decoded text still shows them.
  spec = json.loads(bpe.to_str())
  for added in spec["added_tokens"]:
    added["special"] = added["content"] in QWEN_SPECIAL_TOKENS
  bpe = tokenizers.Tokenizer.from_str(json.dumps(spec))
  hf = PreTrainedTokenizerFast(
    tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
    chat_template=QWEN3_CHAT_TEMPLATE, model_max_length=1 << 20, clean_up_tokenization_spaces=False)
  folder = Path(folder)
  hf.save_pretrained(str(folder))
  # transformers 5 writes its own class name and a chat_template.jinja file; older releases
  # (SGLang's pin, for one) know only PreTrainedTokenizerFast and read the template from
  # tokenizer_config.json, so both are written there too.
  config_path = folder / "tokenizer_config.json"
  config = json.loads(config_path.read_text())
  config.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=QWEN3_CHAT_TEMPLATE)
  config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
  metadata = {
    "recipe": f"{_TINY_PREFIX} v{_TINY_RECIPE_VERSION}", "vocab_size": vocab_size,
    "corpus_fingerprint": corpus_fingerprint, "tokenizers_version": tokenizers.__version__,
    "split_pattern": _SPLIT_PATTERN}
  (folder / _METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
  return folder


def stdlib_corpus(max_chars_per_file: int = _CORPUS_MAX_CHARS_PER_FILE,
                  min_chars: int = _CORPUS_MIN_CHARS) -> tuple[list[str], str]:
  """The standard library's Python source files, in a fixed order, and their fingerprint.

  Files come from sysconfig's "stdlib" folder, walked in sorted order, skipping tests, GUI and
  demo folders; each file contributes at most `max_chars_per_file` characters.

  Args:
    max_chars_per_file: characters kept from the start of each file.
    min_chars: fewest characters in all accepted as a corpus.

  Returns:
    (texts, fingerprint): the file texts, and a sha256 hex digest of the recipe version and
    every (relative path, text) pair, which names the cache folder.
  Raises:
    TokenizerError: the standard library's sources are missing (fewer than min_chars).
  """
  root = Path(sysconfig.get_paths()["stdlib"])
  digest = hashlib.sha256(f"{_TINY_PREFIX} v{_TINY_RECIPE_VERSION}".encode())
  texts = []
  for directory, subdirs, files in os.walk(root):
    subdirs[:] = sorted(d for d in subdirs
                        if d not in _CORPUS_SKIP_DIRS and not d.startswith("config-"))
    for name in sorted(files):
      if not name.endswith(".py"):
        continue
      path = Path(directory) / name
      text = path.read_bytes().decode("utf-8", errors="replace")[:max_chars_per_file]
      digest.update(path.relative_to(root).as_posix().encode() + b"\0" + text.encode() + b"\0")
      texts.append(text)
  if sum(map(len, texts)) < min_chars:
    raise TokenizerError(
      f"the standard library under {root} holds {sum(map(len, texts))} characters of Python "
      f"source; the tiny tokenizer needs at least {min_chars} (is this a stripped "
      "Python install?)")
  return texts, digest.hexdigest()


def _generation_config_eos(name: str) -> list[int]:
  """eos_token_id entries of a local folder's generation_config.json (empty when absent)."""
  path = Path(name) / "generation_config.json"
  if not path.is_file():
    return []
  try:
    eos = json.loads(path.read_text()).get("eos_token_id")
  except (OSError, ValueError) as e:
    raise TokenizerError(f"{path} is not valid JSON: {e}") from e
  if eos is None:
    return []
  return [int(e) for e in (eos if isinstance(eos, list) else [eos])]
