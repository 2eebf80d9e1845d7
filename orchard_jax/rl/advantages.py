"""Group-relative advantages (GRPO, arXiv 2402.03300 section 4.1.2; docs/algorithms.md section 2).

A_i = (r_i - mean(r)) / (std(r) + 1e-6) over the rollouts of one group (population std, ddof 0:
the group is the whole population being normalised). Dr.GRPO (arXiv 2503.20783) drops the std
division ("scale=none"), which otherwise up-weights groups whose rewards barely differ.
These run on the host over small per-group arrays, so they are NumPy.
"""
import numpy as np

from orchard_jax.rl.errors import RLError

ADVANTAGE_SCALES = ("std", "none")


def grpo_advantages(rewards, *, mask=None, scale: str = "std", eps: float = 1e-6) -> np.ndarray:
  """Group-normalised advantages.

  Args:
    rewards: [groups, group_size] (or [group_size] for one group) float rewards.
    mask: optional same-shape bool, False for slots that hold no rollout (excluded from the mean
      and std, advantage 0).
    scale: "std" (GRPO: divide by std + eps) or "none" (Dr.GRPO: centre only).
    eps: added to the std; 1e-6 as in docs/algorithms.md.
  Returns:
    float32 array of rewards' shape. A group whose rewards are all equal gets all zeros.
  Raises:
    RLError: unknown scale, mismatched mask, or non-finite rewards.
  """
  if scale not in ADVANTAGE_SCALES:
    raise RLError(f"advantage scale is {scale!r}; expected one of {ADVANTAGE_SCALES}")
  rewards = np.asarray(rewards, np.float64)
  squeeze = rewards.ndim == 1
  if squeeze:
    rewards = rewards[None]
  if rewards.ndim != 2:
    raise RLError(f"rewards must be [groups, group_size] or [group_size]; saw shape "
                  f"{rewards.shape}")
  mask = np.ones(rewards.shape, bool) if mask is None else np.asarray(mask, bool)
  if squeeze and mask.ndim == 1:
    mask = mask[None]
  if mask.shape != rewards.shape:
    raise RLError(f"mask has shape {mask.shape}; expected rewards' shape {rewards.shape}")
  if not np.all(np.isfinite(rewards[mask])):
    raise RLError(f"rewards must be finite; saw {rewards[mask][~np.isfinite(rewards[mask])]}")
  count = np.maximum(mask.sum(axis=1, keepdims=True), 1)
  mean = np.where(mask, rewards, 0.0).sum(axis=1, keepdims=True) / count
  centred = np.where(mask, rewards - mean, 0.0)
  if scale == "std":
    std = np.sqrt((centred ** 2).sum(axis=1, keepdims=True) / count)
    centred = centred / (std + eps)
  out = centred.astype(np.float32)
  return out[0] if squeeze else out
