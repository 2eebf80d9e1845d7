"""Orchard-SWE: credit-assignment SFT (docs/algorithms.md section 1).

Trajectories come from the replay expert executed on the training tasks (the default, for
machines without a teacher), a trajectory store (`--config.sft.source=runs/swe_distill/store`,
e.g. from experiments/swe_distill.py) or a mini-swe-agent trajectory folder. Annotations come
from the offline evidence annotator (default) or an LLM (`--config.annotator.kind=llm
--config.annotator.url=... --config.annotator.model=... --config.annotator.api_key_env=VAR`,
prompt in orchard_jax/recipes/swe/prompts/swe_annotator.txt). `--config.sft.mode=resolved_only` is
the paper's ablation. Checkpoints go to runs/swe_sft_<preset>/sft; evaluate them with
`experiments/swe_eval.py --config.checkpoint=runs/swe_sft_tiny`.
"""
from experiments import common


def get_config(preset="tiny"):
  config = common.swe_base(preset)
  config.job = "swe.sft"
  config.name = "swe_sft"
  return config
