"""The training algorithms as pure functions on arrays (docs/algorithms.md sections 1-6).

Host-side (NumPy / Python, before packing): credit-assignment SFT targets and filters, GRPO
advantages, BAR group assembly and the group filter, RPR rewards, reranking metrics.
Device-side (JAX, inside the jitted train step): loss aggregation, the clipped policy loss,
OPD terms, value-model BCE.
"""
from orchard_jax.rl.advantages import (ADVANTAGE_SCALES, REWARD_SPREAD_TOL, grpo_advantages,
                                       has_reward_spread)
from orchard_jax.rl.aggregation import (AGGREGATIONS, aggregate, check_aggregation,
                                        loss_normalizer, weighted_mean)
from orchard_jax.rl.bar import (Assembly, BARConfig, GROUP_FILTER_REASONS, ScoredRollout,
                                assemble_group, balanced_adaptive_rollout, group_filter_reasons,
                                positive_counts_to_try, rollouts_to_request, select_groups,
                                try_assemble)
from orchard_jax.rl.credit import (CreditSFTExample, FILTER_REASONS, credit_assignment_sft,
                                   filter_sft_trajectories, has_undefined_tool_call,
                                   interpolate_values, rise_segments, step_credits,
                                   token_loss_weights, trained_steps)
from orchard_jax.rl.errors import RLError
from orchard_jax.rl.intervals import newcombe_interval, wilson_interval
from orchard_jax.rl.opd import (OPD_DIVERGENCES, OPD_REWARD_DIVERGENCES, opd_loss, opd_rewards,
                                opd_token_terms)
from orchard_jax.rl.policy_loss import k3_kl, policy_loss
from orchard_jax.rl.reranking import (best_of_k, expected_calibration_error, pass_at_k,
                                      random_at_k, reranking_report, roc_auc)
from orchard_jax.rl.rpr import (RPRReward, RubricSet, binary_reward, judge_score, rpr_reward,
                                rpr_rewards, snap_score)
from orchard_jax.rl.value import final_positions, sigmoid_bce, value_loss, value_loss_weights
