"""Tokenizer and chat template, trajectory types and store, sequence packing.

The data room sits at the bottom of the import graph: every other room may import it, and it
imports no other room. See README, section "Data: tokenizer, trajectory store, packing".
"""
from orchard_jax.data.chat import QWEN3_CHAT_TEMPLATE
from orchard_jax.data.errors import (
  ChatTemplateError, DataError, PackingError, StoreError, TextOnlyRecordError, TokenizerError,
  ToolCallParseError, TrajectoryFormatError)
from orchard_jax.data.tokenizer import (
  QWEN_MARKUP_TOKENS, QWEN_SPECIAL_TOKENS, TINY_VOCAB_SIZE, Tokenizer, load_tokenizer,
  stdlib_corpus, tiny_tokenizer, tokenizer_cache_dir, train_tiny_tokenizer)
from orchard_jax.data.tool_calls import (
  TOOL_CALL_PARSERS, HermesToolCallParser, ParsedResponse, Qwen3XMLToolCallParser, ToolCall,
  ToolCallError, ToolCallParser, get_tool_call_parser, parse_assistant_text, parse_reasoning,
  split_reasoning)
from orchard_jax.data.records import CHAT_ROLES, ModelCall, Trajectory, chat_messages
from orchard_jax.data.sequences import (
  TrainingSequence, lm_sequences, sequences_from_model_calls, sft_sequences_from_messages)
from orchard_jax.data.store import TrajectoryStore
from orchard_jax.data.packing import (
  OVERFLOW_POLICIES, REQUIRED_KEYS, PackedBatch, PackedData, PackingStats, Placement,
  pack_sequences)
from orchard_jax.data.hf_dataset import export_hf_dataset, trajectory_row
from orchard_jax.data.miniswe import (
  TRAJECTORY_FORMAT, export_miniswe, import_miniswe, read_miniswe_trajectory,
  trajectory_from_miniswe, trajectory_to_miniswe, write_miniswe_trajectory)
from orchard_jax.data.stats import (
  FILTERS, DatasetStats, dataset_stats, plot_histograms, trajectory_filter_reasons)
