"""Orchard-GUI RL (docs/algorithms.md section 9): SFT warm start on the scripted
demonstrations (or policy.init), then multi-turn GRPO in sandboxed Chromium: 5 samples per task,
reward +1 success / -1 repeated format failure / 0 otherwise, clip 0.2 / 0.28, no KL or
entropy, groups whose rewards all agree dropped (dynamic sampling), the step budget 15 then 30.
The tiny preset runs the whole pipeline on 2 CPU cores."""
from experiments import common


def get_config(preset="tiny"):
  config = common.gui_base(preset)
  config.job = "gui.rl"
  config.name = "gui_rl"
  return config
