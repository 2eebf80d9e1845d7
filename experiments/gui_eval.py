"""Orchard-GUI evaluation: a checkpoint (default: the gui_rl run of the same preset) on the
evaluation tasks (MiniWoB++ evaluation seeds, the sites' held-out tasks), eval.k attempts each;
prints the success rate per task family and per site."""
from experiments import common


def get_config(preset="tiny"):
  config = common.gui_base(preset)
  config.job = "gui.evaluate"
  config.name = "gui_eval"
  config.checkpoint = f"runs/gui_rl_{preset}" if preset != "cluster" else ""
  config.eval.splits = ("heldout",)   # the evaluation tasks (GUIDomain.split_tasks)
  config.eval.max_instances = 0
  config.eval.k = 1 if preset == "tiny" else 3
  return config
