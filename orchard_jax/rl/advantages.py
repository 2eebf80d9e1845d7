"""Group-relative advantages (GRPO, arXiv 2402.03300 section 4.1.2; docs/algorithms.md section 2).

A_i = (r_i - mean(r)) / (std(r) + 1e-6) over the rollouts of one group (population std, ddof 0:
the group is the whole population being normalised). Dr.GRPO (arXiv 2503.20783) drops the std
division ("scale=none"), which otherwise up-weights groups whose rewards barely differ.
These run on the host over small per-group arrays, so they are NumPy.

Rewards are taken as float32 values (what the recipes hold), and a group whose rewards differ
by no more than float rounding has no reward spread: max(r) - min(r) <= REWARD_SPREAD_TOL *
max(1, max |r|), 1e-5 (about 80 float32 steps at 1.0, and far below any real reward step: RPR's
smallest is 0.5 * 0.12 * 0.1 = 0.006). Such a group gets all-zero advantages here, and the
group filter drops it (`bar.group_filter_reasons`, "zero_reward_std"), both from the same
`has_reward_spread` on the same float32 values: an all-resolved group whose shaped rewards
differ by one rounding step (1.3435000000000001 vs 1.3435) is no training signal, where the
std + 1e-6 denominator would have blown that noise up into advantages of about +-1.
"""
import numpy as np

from orchard_jax.rl.errors import RLError

ADVANTAGE_SCALES = ("std", "none")
REWARD_SPREAD_TOL = 1e-5


def has_reward_spread(rewards, *, mask=None, tol: float = REWARD_SPREAD_TOL):
  """Whether each group's float32 rewards differ by more than rounding (module docstring).

  Args:
    rewards: [group_size] or [groups, group_size] rewards (cast to float32).
    mask: optional same-shape bool, False for slots that hold no rollout.
    tol: relative tolerance: a spread <= tol * max(1, max |r|) counts as none.
  Returns:
    bool for one group, [groups] bool array otherwise. An empty group has no spread.
  """
  r = np.asarray(rewards, np.float32).astype(np.float64)
  squeeze = r.ndim == 1
  r = r[None] if squeeze else r
  m = np.ones(r.shape, bool) if mask is None else np.asarray(mask, bool).reshape(r.shape)
  high = np.where(m, r, -np.inf).max(axis=1)
  low = np.where(m, r, np.inf).min(axis=1)
  scale = np.maximum(1.0, np.where(m, np.abs(r), 0.0).max(axis=1))
  out = m.any(axis=1) & (high - low > tol * scale)
  return bool(out[0]) if squeeze else out


def grpo_advantages(rewards, *, mask=None, scale: str = "std", eps: float = 1e-6) -> np.ndarray:
  """Group-normalised advantages.

  Args:
    rewards: [groups, group_size] (or [group_size] for one group) float rewards.
    mask: optional same-shape bool, False for slots that hold no rollout (excluded from the mean
      and std, advantage 0).
    scale: "std" (GRPO: divide by std + eps) or "none" (Dr.GRPO: centre only).
    eps: added to the std; 1e-6 as in docs/algorithms.md.
  Returns:
    float32 array of rewards' shape. A group without reward spread (equal rewards, up to
    `REWARD_SPREAD_TOL`) gets all zeros.
  Raises:
    RLError: unknown scale, mismatched mask, or non-finite rewards.
  """
  if scale not in ADVANTAGE_SCALES:
    raise RLError(f"advantage scale is {scale!r}; expected one of {ADVANTAGE_SCALES}")
  rewards = np.asarray(rewards, np.float32).astype(np.float64)   # the values the filter sees
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
  centred = np.where(has_reward_spread(rewards, mask=mask)[:, None], centred, 0.0)
  out = centred.astype(np.float32)
  return out[0] if squeeze else out
