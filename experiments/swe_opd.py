"""Orchard-SWE: on-policy distillation from a teacher (docs/algorithms.md section 4), with BAR or
alone.

The teacher scores the student's own sampled tokens (teacher top-k = 1). It is a second engine:
SGLang servers (`opd.teacher_urls`; the cluster preset reads ORCHARD_SGLANG_TEACHER_URLS) or an
embedded engine serving a checkpoint or Hugging Face folder of any size (`opd.teacher_init`,
`opd.teacher_preset`). Modes: "loss" (L = L_GRPO + coef L_OPD, the default), "reward"
(A_t += coef r_t) and "only" (L = L_OPD). Orchard's setting: constant LR 1e-6, temperature 1.0.

    python launch/run.py --config experiments/swe_opd.py --config.opd.teacher_init=runs/swe_rpr_tiny
    python launch/run.py --config experiments/swe_opd.py --config.opd.mode=only ...
"""
from experiments import common


def get_config(preset="tiny"):
  config = common.swe_base(preset)
  config.job = "swe.rl"
  config.name = "swe_opd"
  config.rl.reward = "binary"
  config.opd.mode = "loss"
  config.opd.divergence = "js_skew"
  config.opd.coef = 1.0
  config.opd.teacher_init = "" if preset == "tiny" else "/models/teacher"
  config.rl.schedule = "constant"
  config.sampling.temperature = 1.0
  config.sampling.top_p = 1.0
  if preset != "tiny":
    config.rl.lr = config.rl.end_lr = 1e-6
  return config
