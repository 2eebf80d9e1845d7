"""Orchard-GUI SFT (docs/algorithms.md section 9): the scripted demonstrations played through
the browser harness (or a trajectory store via --config.sft.source=PATH), one sample per turn
with its loss on that turn's call, the vision encoder and projector frozen."""
from experiments import common


def get_config(preset="tiny"):
  config = common.gui_base(preset)
  config.job = "gui.sft"
  config.name = "gui_sft"
  return config
